"""What ``run`` checks before it relays: what cannot heal ends it at once, one line each.

Contract (:func:`check_kafka_config`, then :func:`check_before_run`):

- the Kafka producer configuration must be accepted by librdkafka (``ConfigError``, exit 2);
- PostgreSQL is retried while it cannot be reached (connection refused, server starting,
  timeouts: a WARNING line at the first failure and then at most every
  :data:`LOG_EVERY_S`), until ``stop`` is set (then it returns ``False``);
- a refused login ends it (``AuthenticationFailed``, exit 6);
- then ``init``'s own preflight checks (:func:`cdc_outbox.admin.preflight.preflight`, not a
  second copy of them) decide, for every configured outbox table: a missing outbox table or
  column (for the columns the configured mode needs, polling columns included in ``auto`` and
  ``polling`` mode for a table with status columns) raises ``SchemaMissing`` (exit 4); a role
  without REPLICATION in ``cdc`` mode, or without the table privileges the mode needs on a
  table, raises ``PrivilegeMissing`` (exit 5); the message names the table. In ``auto`` mode a role
  without REPLICATION is no error: polling needs none (the service falls back).
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from psycopg import sql

from cdc_outbox.admin import lifecycle
from cdc_outbox.admin.checks import Check
from cdc_outbox.admin.preflight import evaluate_checks, table_state
from cdc_outbox.config.backoff import STARTUP, Backoff
from cdc_outbox.config.settings import OutboxSettings, Settings
from cdc_outbox.errors import CdcOutboxError, PrivilegeMissing, SchemaMissing, raise_if_cannot_heal
from cdc_outbox.kafka.producer_config import check_producer_config, eos_config
from cdc_outbox.store.inspection import DatabaseState, inspect_database
from cdc_outbox.store.schema import POLLING_COLUMNS, outbox_ident

__all__ = ["LOG_EVERY_S", "check_before_run", "check_kafka_config"]

logger = logging.getLogger(__name__)

#: A transient failure is logged at most this often while it lasts.
LOG_EVERY_S = 30.0


def check_kafka_config(settings: Settings) -> None:
    """``ConfigError`` (one line) unless librdkafka accepts the relay's producer settings
    (as the relay merges them: exactly-once makes it transactional, halt makes it gapless)."""
    eos = settings.delivery == "exactly_once"
    config = settings.kafka_config()
    if eos:
        config = eos_config(config, settings.eos.transaction_timeout_ms)
    check_producer_config(
        config, gapless=settings.on_permanent_error == "halt" and not eos, transactional=eos
    )


def check_before_run(settings: Settings, stop: threading.Event) -> bool:
    """The database checks of the module contract; ``False`` if ``stop`` was set while
    waiting (:func:`check_kafka_config` is the caller's, before it starts monitoring)."""
    failures, logged_at, backoff = 0, float("-inf"), Backoff(STARTUP)
    while not stop.is_set():
        try:
            with lifecycle.connect(settings) as conn:
                state = inspect_database(conn, settings)
                checks = evaluate_checks(state, settings, create_table=False)
                privileges = {
                    o.name: _table_privileges(conn, settings, o)
                    for o in settings.outbox_settings()
                    if table_state(state, o).oid is not None
                }
            break
        except (CdcOutboxError, psycopg.Error) as exc:
            raise_if_cannot_heal(exc)
            failures += 1
            logger.debug("PostgreSQL attempt %d failed", failures)
            if time.monotonic() - logged_at >= LOG_EVERY_S:
                logged_at = time.monotonic()
                logger.warning("PostgreSQL not usable yet (%s); retrying (attempt %d)",
                               " ".join(str(exc).split()), failures)  # fmt: skip
            stop.wait(backoff.failed())
    else:
        return False
    if failures:
        logger.info("PostgreSQL reachable after %d failed attempts", failures)
    _judge(settings, state, checks, privileges)
    return True


def _needs_polling_columns(settings: Settings, outbox: OutboxSettings) -> bool:
    return settings.mode in ("auto", "polling") and outbox.columns.has_status


def _needed_privileges(settings: Settings, outbox: OutboxSettings) -> list[str]:
    needed = ["SELECT"]
    if _needs_polling_columns(settings, outbox) or outbox.cdc_mark_published == "update":
        needed.append("UPDATE")
    if outbox.cdc_mark_published == "delete" and settings.mode != "polling":
        needed.append("DELETE")
    return needed


#: Column grants count (the least-privilege role of sql/roles.sql updates some columns only).
_PRIVILEGE_FUNCTION = {
    "SELECT": "has_any_column_privilege",
    "UPDATE": "has_any_column_privilege",
    "DELETE": "has_table_privilege",
}


def _table_privileges(conn: psycopg.Connection[tuple[object, ...]], settings: Settings,
                      outbox: OutboxSettings) -> dict[str, bool]:  # fmt: skip
    table = outbox_ident(settings, outbox).as_string(conn)
    names = _needed_privileges(settings, outbox)
    row = conn.execute(
        sql.SQL("SELECT {}").format(
            sql.SQL(", ").join(
                sql.SQL("{}(%s, {})").format(sql.SQL(_PRIVILEGE_FUNCTION[p]), sql.Literal(p))
                for p in names
            )
        ),
        [table] * len(names),
    ).fetchone()
    assert row is not None
    return {p: bool(ok) for p, ok in zip(names, row, strict=True)}


def _judge(
    settings: Settings,
    state: DatabaseState,
    checks: list[Check],
    privileges: dict[str, dict[str, bool]],
) -> None:
    """Raise for the first unusable outbox table (in configuration order), then REPLICATION."""
    for outbox in settings.outbox_settings():
        _judge_table(settings, state, outbox, privileges.get(outbox.name, {}))
    by_name = {c.name: c for c in checks}
    replication = by_name.get("replication_privilege")
    if settings.mode == "cdc" and replication is not None and not replication.ok:
        raise PrivilegeMissing(f"privileges: {replication.detail} (fix: {replication.fix})")


def _judge_table(
    settings: Settings,
    state: DatabaseState,
    outbox: OutboxSettings,
    privileges: dict[str, bool],
) -> None:
    table, ts = outbox.name, table_state(state, outbox)
    if ts.oid is None:
        raise SchemaMissing(
            f"schema: table {table} does not exist (fix: `cdc-outbox init --create-table`"
            " creates it, or set outbox_schema / outbox_table (the [[outboxes]] entry) to the"
            " outbox table)"
        )
    missing = [c for c in settings.column_names(outbox).row_columns() if c not in ts.columns]
    if missing:
        raise SchemaMissing(
            f"schema: table {table}: missing column(s): {', '.join(missing)} (fix: add them to"
            " the table, or map them with the columns.* settings)"
        )
    if _needs_polling_columns(settings, outbox):
        missing = [c for c in POLLING_COLUMNS if c not in ts.columns]
        if missing:
            raise SchemaMissing(
                f"schema: table {table} lacks the polling column(s) {', '.join(missing)}"
                f" (mode {settings.mode}) (fix: add them, as `cdc-outbox init --create-table`"
                ' would create them, or set mode = "cdc")'
            )
    role = state.user
    lacking = [p for p, ok in privileges.items() if not ok]
    if lacking:
        raise PrivilegeMissing(
            f"privileges: role '{role}' lacks {', '.join(lacking)} on {table} (fix: GRANT"
            f' {", ".join(lacking)} ON {table} TO "{role}")'
        )
