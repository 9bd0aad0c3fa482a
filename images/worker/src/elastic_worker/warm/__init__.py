"""warm."""
