"""Probes and housekeeping the service runs around its relays (pooled short connections).

Each function opens a pooled connection of its own and closes it: whether CDC can run now
(:func:`cdc_problem`), checks that refuse a run that would skip or repeat events (exit 3), and
creating the publication or dropping the slot as the leader.
"""

from __future__ import annotations

import logging

import psycopg

from cdc_outbox.admin import lifecycle
from cdc_outbox.admin.preflight import missing_from_publication
from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import CdcOutboxError, PreflightError, SchemaMissing, raise_if_cannot_heal
from cdc_outbox.store import db_pool, relay_state, schema
from cdc_outbox.store.inspection import inspect_database
from cdc_outbox.store.leases import drop_slot_if_leader

__all__ = [
    "cdc_problem",
    "drop_slot_quietly",
    "ensure_publication",
    "ensure_state_table",
    "publication_must_fit",
    "statusless_catch_up_must_be_safe",
]

logger = logging.getLogger(__name__)


def cdc_problem(settings: Settings) -> str | None:
    """Why CDC cannot run now (None: it can). A missing or invalidated slot is no problem
    (a fresh one will be created); a missing publication is none if we may create it."""
    try:
        with db_pool.pooled(settings) as conn:
            checks = lifecycle.preflight(conn, settings)
    except (CdcOutboxError, psycopg.Error) as exc:
        raise_if_cannot_heal(exc)
        return str(exc)
    for check in checks:  # polling needs them as well: no reason to fall back
        if check.name in ("outbox_table", "outbox_columns") and not check.ok:
            raise SchemaMissing(f"schema: {check.detail} (fix: {check.fix})")
    bad = [c for c in checks if not c.ok and not (c.name == "slot" and "lost" in c.detail)]
    return "; ".join(f"{c.name}: {c.detail}" for c in bad) or None


def decoding_error(settings: Settings, slot: str) -> str:
    """The error (with DETAIL) PostgreSQL gives for decoding the invalidated ``slot``; before
    17 it is the one place that tells a recovery conflict from removed WAL ("" if none)."""
    try:
        with db_pool.pooled(settings) as conn:
            conn.execute("SELECT pg_logical_slot_peek_binary_changes(%s, NULL, 1)", (slot,))
    except psycopg.Error as exc:
        return f"{exc} {exc.diag.message_detail or ''}"
    return ""


def ensure_state_table(settings: Settings) -> None:
    try:
        with db_pool.pooled(settings) as conn:
            relay_state.ensure_table(conn, settings)
    except (CdcOutboxError, psycopg.Error) as exc:
        raise_if_cannot_heal(exc)
        logger.warning("could not check the relay state table: %s", exc)


def publication_must_fit(settings: Settings) -> None:
    """Raise ``PreflightError`` (exit 3) if an existing publication would miss outbox rows
    (other tables or operations, or a partitioned outbox without publish_via_partition_root):
    cdc mode cannot fall back, and streaming it would skip events silently."""
    try:
        with db_pool.pooled(settings) as conn:
            checks = lifecycle.preflight(conn, settings)
    except (CdcOutboxError, psycopg.Error):
        return  # the database is unreachable: the relay's own retries deal with that
    for check in checks:
        if check.name == "publication" and not check.ok:
            raise PreflightError(f"publication: {check.detail} (fix: {check.fix})")


def statusless_catch_up_must_be_safe(settings: Settings, reason: str) -> None:
    """Raise ``PreflightError`` (exit 3) before a catch-up that would publish every row of an
    outbox table again: a layout without a status column keeps published rows only with
    ``cdc_mark_published = "off"``, and then nothing tells them from unpublished ones. Checked
    per table; an empty table is fine."""
    unsafe = [
        o for o in settings.outbox_settings()
        if not o.columns.has_status and o.cdc_mark_published == "off"
    ]  # fmt: skip
    if not unsafe:
        return
    with db_pool.pooled(settings) as conn:
        for outbox in unsafe:
            rows = lifecycle.unpublished_rows(conn, settings, [outbox])
            if rows:
                raise PreflightError(
                    f"a catch-up is needed ({reason}) but {outbox.name} has {rows} rows and,"
                    ' without a status column and with cdc_mark_published = "off", published'
                    " ones cannot be told from unpublished ones: it would publish all of them"
                    ' again (fix: cdc_mark_published = "delete", or delete the rows already'
                    " in Kafka, then restart)"
                )


def ensure_publication(settings: Settings) -> None:
    """Create the publication of every configured outbox table, or add the configured tables
    it lacks (called before a catch-up, whose fresh slot and snapshot then cover them)."""
    with db_pool.pooled(settings) as conn:
        st = inspect_database(conn, settings)
        if st.publication is None:
            conn.execute(schema.publication_ddl(settings))
            logger.info("created publication %s", settings.publication_name)
        elif missing := missing_from_publication(st, settings):
            conn.execute(schema.add_to_publication_ddl(settings, missing))
            logger.info(
                "added %s to publication %s",
                ", ".join(o.name for o in missing),
                settings.publication_name,
            )


def drop_slot_quietly(settings: Settings, *, leader_id: str) -> None:
    """Drop the slot if it exists, is not in use and ``leader_id`` still holds the lease,
    checked in the same statement: a frozen ex-leader waking up never drops the slot of the
    leader that replaced it (best effort, logged)."""
    try:
        with db_pool.pooled(settings) as conn:
            state = schema.relay_state_ident(settings)
            conn.execute(drop_slot_if_leader(state, settings.slot_name, leader_id))
    except (CdcOutboxError, psycopg.Error) as exc:
        logger.warning("could not drop slot %s: %s", settings.slot_name, exc)
