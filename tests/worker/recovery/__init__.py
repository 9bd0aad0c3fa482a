"""Tests of elastic_worker.recovery, mirroring its layout."""
