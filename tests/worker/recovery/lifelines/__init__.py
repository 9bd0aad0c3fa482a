"""Tests of elastic_worker.recovery.lifelines, mirroring its layout."""
