"""elastic-job: operate an elastic-job release from a terminal."""
