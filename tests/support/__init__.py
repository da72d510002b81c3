"""Shared test helpers: the only test code other test modules import."""
