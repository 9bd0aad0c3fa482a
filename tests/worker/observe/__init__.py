"""Tests of elastic_worker.observe, mirroring its layout."""
