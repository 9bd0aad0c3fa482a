"""Tests of elastic_worker.keystore, mirroring its layout."""
