"""Tests of elastic_worker.launch, mirroring its layout."""
