"""Exception types shared across cdc-outbox, with the CLI exit codes they map to."""

from __future__ import annotations


class CdcOutboxError(Exception):
    """Base class of every error cdc-outbox raises on purpose."""

    exit_code = 1


class ConfigError(CdcOutboxError):
    """Invalid settings or command-line input (exit code 2)."""

    exit_code = 2


class PreflightError(CdcOutboxError):
    """The database is not ready for logical replication (exit code 3)."""

    exit_code = 3


class DecodeError(CdcOutboxError):
    """Malformed replication bytes; the message names the message type and byte offset."""


class RelayHalted(CdcOutboxError):
    """The relay stopped on purpose (e.g. a permanent delivery error with halt policy)."""


class DatabaseUnavailable(CdcOutboxError):
    """PostgreSQL could not be reached or refused the login (exit code 1)."""
