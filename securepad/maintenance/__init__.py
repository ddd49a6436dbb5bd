"""Whole-store work: gc, stats, rotation, verify, restore."""
