"""A run directory's files and their formats, read and written through one place."""
