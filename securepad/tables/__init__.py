"""The only owners of sealed-table SQL: the authorized fetch, quota, records, entries, heads."""
