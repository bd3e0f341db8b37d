"""Test support code shared by the integration tests (not part of the collection)."""
