"""Exception types shared across cdc-outbox, the CLI exit codes they map to, and the one
classification of failures every stage acts on (:func:`classify`).

Exit codes: 0 ok; 1 runtime error; 2 configuration (:class:`ConfigError`, librdkafka
settings included); 3 preflight (:class:`PreflightError`); 4 a database object is missing
(:class:`SchemaMissing`); 5 a privilege is missing (:class:`PrivilegeMissing`); 6 the login
was refused (:class:`AuthenticationFailed`); 7 a Kafka topic is missing
(:class:`TopicMissing`); 8 the replication slot was invalidated, in cdc mode
(:class:`SlotInvalidated`).

:func:`classify` gives a :class:`Verdict` (a :class:`FailureClass` and a hint) for any
failure: an exception, or a :class:`Failure` that the layer which saw it describes (Kafka's
delivery reports, :func:`cdc_outbox.kafka.delivery_failure.describe`, which keeps Kafka's code
table since only ``kafka/`` reads librdkafka's codes; the encoder's problems,
:func:`cdc_outbox.delivery.policy.on_encode_failure`). The classes:

- ``RETRY``: transient (server down, connection refused, broker down, a slot still held, a
  Kafka producer that must be replaced): keep retrying with back-off
  (:mod:`cdc_outbox.config.backoff`) and a throttled log line; the hint, if any, names the
  problem for alerts and metrics (``topic_missing``, ``producer_fatal``, ...);
- ``DEAD_LETTER``: this one record can never be written (:attr:`Fault.RECORD`: Kafka's
  record-level rejections; a payload its schema refuses): it is dead-lettered, or halted on
  with ``on_permanent_error = "halt"`` (:mod:`cdc_outbox.delivery.policy` decides);
- ``HALT``: cannot heal without a human (schema, privileges, authentication, invalid
  configuration, a missing topic): ``run`` ends with one line, the hint, naming the object and
  the fix (:attr:`Verdict.error`, from :func:`cannot_heal`) and the class's exit code,
  ``/healthz`` failing while it shuts down.

The SQLSTATEs and libpq texts that cannot heal are listed here once (``SQLSTATE_*``,
:data:`AUTH_FAILED_TEXT`); the replication stream reads the same lists.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field


class FailureClass(enum.Enum):
    """What to do about a failure (see the module docstring): the one vocabulary."""

    RETRY = "retry"
    DEAD_LETTER = "dead_letter"
    HALT = "halt"


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


# -- the SQLSTATEs that cannot heal: the one list ----------------------------------------
SQLSTATE_NO_DATABASE = "3D000"  # invalid_catalog_name
#: A missing object: the statement can never succeed as is (what is missing).
SQLSTATE_SCHEMA = {
    "42P01": "table",  # undefined_table
    "42703": "column",  # undefined_column
    "3F000": "schema",  # invalid_schema_name
    SQLSTATE_NO_DATABASE: "database",
}
SQLSTATE_PRIVILEGE = frozenset({"42501"})  # insufficient_privilege (also: no REPLICATION)
SQLSTATE_AUTH = frozenset({"28000", "28P01"})  # invalid authorization, invalid password
#: Replication commands: wal_level too low or the slot invalidated (object_not_in_prerequisite
#: _state); the slot or the publication missing (undefined_object).
SQLSTATE_REPLICATION_SETUP = frozenset({"55000", "42704"})
#: SQLSTATEs after which streaming cannot work until someone changes the server.
REPLICATION_PERMANENT_SQLSTATES = (
    SQLSTATE_REPLICATION_SETUP
    | SQLSTATE_PRIVILEGE
    | SQLSTATE_AUTH
    | frozenset({SQLSTATE_NO_DATABASE})
)
#: Login refusals as libpq reports them (a failed connection carries no SQLSTATE).
AUTH_FAILED_TEXT = (
    "password authentication failed",
    "no pg_hba.conf entry",
    "authentication failed",
    "password is required",
)
_AUTH_TEXT = re.compile(
    "|".join(map(re.escape, AUTH_FAILED_TEXT)) + r'|role "[^"]*" does not exist'
)
_DATABASE_TEXT = re.compile(r"database \"[^\"]*\" does not exist")
_SCHEMA_FIX = (
    "`cdc-outbox init --create-table` creates the outbox table; or fix outbox_schema,"
    " outbox_table and the columns.* settings"
)


class Fault(enum.Enum):
    """Whose fault a described failure is (:class:`Failure`)."""

    RECORD = "record"  # this record can never be written as it is
    SERVICE = "service"  # a service or client is unavailable or unusable: it can heal


@dataclass(frozen=True, slots=True)
class Failure:
    """A failure as the layer that saw it describes it, for :func:`classify` to decide on:
    whose fault it is and, optionally, the problem's name for alerts and metrics."""

    fault: Fault
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do about a failure (:func:`classify`): ``kind``, and a ``hint``: the one line
    to end with (``HALT``) or the problem's name (``RETRY``, ``DEAD_LETTER``), else ``None``.
    ``error`` is the error to end ``run`` with, set exactly for ``HALT``."""

    kind: FailureClass
    hint: str | None
    error: CdcOutboxError | None = field(default=None, compare=False)


def classify(failure: BaseException | Failure) -> Verdict:
    """The one classification (see the module docstring). An exception: ``HALT`` if it cannot
    heal without a human (:func:`cannot_heal`), else ``RETRY``. A described
    :class:`Failure`: ``DEAD_LETTER`` if it is the record's fault, else ``RETRY``; never
    ``HALT`` (the delivery policy halts on a dead letter with ``on_permanent_error = "halt"``).
    """
    if isinstance(failure, Failure):
        kind = FailureClass.DEAD_LETTER if failure.fault is Fault.RECORD else FailureClass.RETRY
        return Verdict(kind, failure.problem)
    fatal = cannot_heal(failure)
    if fatal is None:
        return Verdict(FailureClass.RETRY, None)
    return Verdict(FailureClass.HALT, str(fatal), fatal)


def cannot_heal(exc: BaseException) -> CdcOutboxError | None:
    """The error to end ``run`` with if ``exc`` cannot heal (``exc`` itself when it already
    is one), else ``None``. Database errors are recognised by SQLSTATE, login refusals by
    libpq's text."""
    if isinstance(exc, ConfigError | PreflightError | CannotHeal):
        return exc
    text = " ".join(_primary(exc).split())
    state = getattr(exc, "sqlstate", None)
    if state in SQLSTATE_AUTH or (state is None and _AUTH_TEXT.search(text)):
        return AuthenticationFailed(
            f"authentication: PostgreSQL refused the login ({text}) (fix: the user and"
            " password in dsn / CDC_OUTBOX_DSN, or pg_hba.conf)"
        )
    if _DATABASE_TEXT.search(text) and state is None:
        return SchemaMissing(f"schema: {text} (fix: the dbname in dsn / CDC_OUTBOX_DSN)")
    if state in SQLSTATE_SCHEMA:
        return SchemaMissing(f"schema: {text} (fix: {_SCHEMA_FIX})")
    if state in SQLSTATE_PRIVILEGE:
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
    """Raise the error of :func:`classify`'s ``HALT`` for ``exc`` (retrying cannot help);
    return if ``exc`` is to be retried."""
    if (fatal := classify(exc).error) is not None:
        raise fatal from None


def topic_missing(topic: str, reason: str) -> str:
    """The one line for a Kafka topic that does not exist (auto-creation off)."""
    return (
        f"topic: Kafka topic '{topic}' does not exist and the broker does not create it"
        f" ({reason}) (fix: create it, e.g. kafka-topics.sh --create --topic {topic}, or set"
        " auto.create.topics.enable=true on the brokers; then start run again)"
    )
