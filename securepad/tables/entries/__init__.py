"""Entries: prepare, put, open, list."""
