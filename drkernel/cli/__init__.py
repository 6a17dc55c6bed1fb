"""The `drkernel` command line."""
