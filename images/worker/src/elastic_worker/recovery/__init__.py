"""recovery."""
