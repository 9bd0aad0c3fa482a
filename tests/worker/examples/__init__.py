"""Tests of images/worker/examples (the reference training script)."""
