"""Shared test helpers: the only test code other test modules import (a test module never
imports another; tests/unit/test_test_imports.py checks it). Waits are on conditions
(:func:`tests.support.helpers.wait_until`), not fixed sleeps."""
