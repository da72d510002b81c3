"""Exception types shared across cdc-outbox, the CLI exit codes they map to, and the one
classification of failures the long-running commands act on (:func:`classify`).

Exit codes: 0 ok; 1 runtime error; 2 configuration (:class:`ConfigError`, librdkafka
settings included); 3 preflight (:class:`PreflightError`); 4 a database object is missing
(:class:`SchemaMissing`); 5 a privilege is missing (:class:`PrivilegeMissing`); 6 the login
was refused (:class:`AuthenticationFailed`); 7 a Kafka topic is missing
(:class:`TopicMissing`); 8 the replication slot was invalidated, in cdc mode
(:class:`SlotInvalidated`).

Failure classes (:data:`FailureClass`):

- ``retry``: transient (server down, connection refused, broker down, a slot still held):
  keep retrying with back-off and a throttled log line;
- ``reject``: this one record can never be written (the Kafka publisher's ``record`` kind:
  dead-lettered or halted on, per ``on_permanent_error``);
- ``fatal``: cannot heal without a human (schema, privileges, authentication, invalid
  configuration, a missing topic): ``run`` ends with one line naming the object and the fix
  and the class's exit code, ``/healthz`` failing while it shuts down.
"""

from __future__ import annotations

import re
from typing import Literal

FailureClass = Literal["retry", "reject", "fatal"]


class CdcOutboxError(Exception):
    """Base class of every error cdc-outbox raises on purpose."""

    exit_code = 1


class ConfigError(CdcOutboxError):
    """Invalid settings or command-line input (exit code 2)."""

    exit_code = 2


class PreflightError(CdcOutboxError):
    """The database is not ready for logical replication (exit code 3)."""

    exit_code = 3


class CannotHeal(CdcOutboxError):
    """A failure no retry can fix; the message names the object and the fix."""


class SchemaMissing(CannotHeal):
    """The outbox table, one of its columns, a schema or the database is missing (exit 4)."""

    exit_code = 4


class PrivilegeMissing(CannotHeal):
    """The relay's role lacks a privilege it needs (exit 5)."""

    exit_code = 5


class AuthenticationFailed(CannotHeal):
    """PostgreSQL (or Kafka) refused the login: wrong password, unknown role (exit 6)."""

    exit_code = 6


class TopicMissing(CannotHeal):
    """A Kafka topic does not exist and the broker does not create it (exit 7)."""

    exit_code = 7


class SlotInvalidated(CannotHeal):
    """cdc mode: PostgreSQL invalidated the slot (removed WAL, a recovery conflict, idle
    timeout); only auto mode recreates it (exit 8). See cdc_outbox.ha.slot_invalidation."""

    exit_code = 8


class DecodeError(CdcOutboxError):
    """Malformed replication bytes; the message names the message type and byte offset."""


class RelayHalted(CdcOutboxError):
    """The relay stopped on purpose (e.g. a permanent delivery error with halt policy)."""


class DatabaseUnavailable(CdcOutboxError):
    """PostgreSQL could not be reached or refused the login (exit code 1)."""


#: SQLSTATEs of a missing object / privilege (the statement can never succeed as is).
_SCHEMA_SQLSTATES = {
    "42P01": "table",  # undefined_table
    "42703": "column",  # undefined_column
    "3F000": "schema",  # invalid_schema_name
    "3D000": "database",  # invalid_catalog_name
}
_PRIVILEGE_SQLSTATES = frozenset({"42501"})  # insufficient_privilege
_AUTH_SQLSTATES = frozenset({"28000", "28P01"})  # invalid authorization, invalid password
#: Login refusals as libpq reports them (a failed connection carries no SQLSTATE).
_AUTH_TEXT = re.compile(
    r"password authentication failed|no pg_hba\.conf entry|role \"[^\"]*\" does not exist"
    r"|authentication failed|password is required"
)
_DATABASE_TEXT = re.compile(r"database \"[^\"]*\" does not exist")
_SCHEMA_FIX = (
    "`cdc-outbox init --create-table` creates the outbox table; or fix outbox_schema,"
    " outbox_table and the columns.* settings"
)


def classify(exc: BaseException) -> FailureClass:
    """``fatal`` if ``exc`` cannot heal without a human (see the module docstring), else
    ``retry``. (``reject`` is decided per record by the Kafka publisher.)"""
    return "fatal" if cannot_heal(exc) is not None else "retry"


def cannot_heal(exc: BaseException) -> CdcOutboxError | None:
    """The error to end ``run`` with if ``exc`` cannot heal (``exc`` itself when it already
    is one), else ``None``. Database errors are recognised by SQLSTATE, login refusals by
    libpq's text."""
    if isinstance(exc, ConfigError | PreflightError | CannotHeal):
        return exc
    text = " ".join(_primary(exc).split())
    state = getattr(exc, "sqlstate", None)
    if state in _AUTH_SQLSTATES or (state is None and _AUTH_TEXT.search(text)):
        return AuthenticationFailed(
            f"authentication: PostgreSQL refused the login ({text}) (fix: the user and"
            " password in dsn / CDC_OUTBOX_DSN, or pg_hba.conf)"
        )
    if _DATABASE_TEXT.search(text) and state is None:
        return SchemaMissing(f"schema: {text} (fix: the dbname in dsn / CDC_OUTBOX_DSN)")
    if state in _SCHEMA_SQLSTATES:
        return SchemaMissing(f"schema: {text} (fix: {_SCHEMA_FIX})")
    if state in _PRIVILEGE_SQLSTATES:
        return PrivilegeMissing(
            f"privileges: {text} (fix: GRANT the privilege to the relay's role; see"
            " docs/configuration.md, 'Least-privilege role')"
        )
    return None


def _primary(exc: BaseException) -> str:
    """The server's primary message (no LINE/caret lines), else the exception's text."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    return str(primary or exc)


def raise_if_cannot_heal(exc: BaseException) -> None:
    """Raise :func:`cannot_heal`'s error for ``exc`` (retrying cannot help), if any."""
    if (fatal := cannot_heal(exc)) is not None:
        raise fatal from None


def topic_missing(topic: str, reason: str) -> str:
    """The one line for a Kafka topic that does not exist (auto-creation off)."""
    return (
        f"topic: Kafka topic '{topic}' does not exist and the broker does not create it"
        f" ({reason}) (fix: create it, e.g. kafka-topics.sh --create --topic {topic}, or set"
        " auto.create.topics.enable=true on the brokers; then start run again)"
    )
