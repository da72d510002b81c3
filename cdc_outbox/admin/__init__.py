"""Operator commands: preflight, init/status/drop, outbox operations."""
