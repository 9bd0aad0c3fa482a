"""Tests of elastic_worker.warm, mirroring its layout."""
