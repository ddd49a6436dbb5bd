"""Turn, owner and usage heads: the sealed tallies that make removal and rollback evident."""
