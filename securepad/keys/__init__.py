"""Where the master key comes from, the owner keys wrapped under it, and their cache."""
