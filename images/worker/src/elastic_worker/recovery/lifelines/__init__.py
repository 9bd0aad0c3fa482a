"""recovery/lifelines."""
