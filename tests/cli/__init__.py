"""The command line through click's runner, one file per feature."""
