"""Tests of elastic_worker.gate, mirroring its layout."""
