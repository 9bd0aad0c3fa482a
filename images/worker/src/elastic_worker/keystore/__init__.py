"""keystore."""
