"""observe."""
