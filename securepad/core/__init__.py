"""Pure parts: no SQL, no keys, no I/O (observations, views, segments, read modes, grep)."""
