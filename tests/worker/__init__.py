"""Tests of elastic_worker, mirroring its layout."""
