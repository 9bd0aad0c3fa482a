"""Tests of elastic_worker.settings, mirroring its layout."""
