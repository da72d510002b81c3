"""Preflight checks: is the server ready for the relay, and can ``init`` set it up?

:func:`preflight` inspects the server and returns :class:`Check` rows (never raises for a
failed check); ``init`` raises :class:`PreflightFailed` (exit 3) if any check failed.
"""

from __future__ import annotations

from cdc_outbox.admin.checks import Check
from cdc_outbox.admin.failover_checks import primary_failover_checks, table_less_checks
from cdc_outbox.cdc.catch_up_order import order_key
from cdc_outbox.config import Settings
from cdc_outbox.errors import PreflightError
from cdc_outbox.store.inspection import Conn, DatabaseState, inspect_database

__all__ = ["MIN_SERVER_VERSION", "PreflightFailed", "evaluate_checks", "preflight"]

#: PostgreSQL 15: returning to CDC creates the slot with CREATE_REPLICATION_SLOT ... (SNAPSHOT
#: 'export'), the option syntax PostgreSQL 15 introduced.
MIN_SERVER_VERSION = 150000


class PreflightFailed(PreflightError):
    """At least one preflight check failed; ``checks`` holds all of them."""

    def __init__(self, checks: list[Check]) -> None:
        self.checks = checks
        failed = [c for c in checks if not c.ok]
        super().__init__(
            "preflight failed: "
            + "; ".join(
                f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "") for c in failed
            )
        )


def _required_columns(settings: Settings) -> list[str]:
    return settings.column_names().row_columns()


def preflight(conn: Conn, settings: Settings, *, create_table: bool = False) -> list[Check]:
    """Readiness checks; names: server_version, wal_level, replication_privilege,
    replication_slots, wal_senders, outbox_table, outbox_columns, catch_up_order (when the
    table exists or will be created), publication, slot; on PostgreSQL 17+ failover_slot
    (when the slot exists) and synchronized_standby_slots (warnings only)."""
    return evaluate_checks(inspect_database(conn, settings), settings, create_table)


def _check(name: str, ok: bool, detail: str, fix: str = "") -> Check:
    return Check(name, ok, detail, "" if ok else fix)


def evaluate_checks(st: DatabaseState, settings: Settings, create_table: bool) -> list[Check]:
    """The :func:`preflight` checks for an already inspected database."""
    priv = st.superuser or st.replication
    free_slots = st.max_slots - st.used_slots
    free_senders = st.max_senders - st.used_senders
    checks = [
        _check("server_version", st.version_num >= MIN_SERVER_VERSION,
               f"PostgreSQL {st.version}", "upgrade to PostgreSQL 15 or later"),
        _check("wal_level", st.wal_level == "logical", f"wal_level is '{st.wal_level}'",
               "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"),
        _check("replication_privilege", priv,
               f"role '{st.user}' {'has' if priv else 'lacks'} REPLICATION",
               f'as a superuser: ALTER ROLE "{st.user}" REPLICATION'),
        _check("replication_slots", True, f"slot '{settings.slot_name}' already exists")
        if st.slot is not None else
        _check("replication_slots", free_slots > 0,
               f"{free_slots} of {st.max_slots} replication slots free",
               "raise max_replication_slots (restart) or drop unused slots"),
        _check("wal_senders", free_senders > 0,
               f"{free_senders} of {st.max_senders} WAL senders free",
               "raise max_wal_senders (restart)"),
    ]  # fmt: skip
    table = f"{settings.outbox_schema}.{settings.outbox_table}"
    if st.table_oid is not None:
        missing = [c for c in _required_columns(settings) if c not in st.table_columns]
        checks.append(_check("outbox_table", True, f"table {table} exists"))
        checks.append(_check("outbox_columns", not missing,
                             f"missing column(s): {', '.join(missing)}" if missing
                             else "all columns present",
                             "fix the columns.* settings or the table"))  # fmt: skip
        checks.append(_order_check(st, settings))
    elif create_table:
        ok = st.can_create_in_schema
        checks.append(_check("outbox_table", ok,
                             f"table {table} will be created" if ok
                             else f"no CREATE privilege on schema {settings.outbox_schema}",
                             "run init as the schema owner"))  # fmt: skip
        checks.append(_order_check(st, settings))
    else:
        checks.append(_check("outbox_table", False, f"table {table} does not exist",
                             "pass --create-table, or run the SQL that"
                             " `cdc-outbox sql outbox` prints"))  # fmt: skip
    checks.append(_publication_check(st, settings, table))
    checks.append(_slot_check(st, settings))
    checks += primary_failover_checks(
        st.version_num, st.synchronized_standby_slots, st.slot_failover
    )
    if settings.message_prefix is not None:
        checks += table_less_checks(
            st.version_num, st.slot_failover, settings.slot_failover, st.max_slot_wal_keep_size_mb
        )
    return checks


def _order_check(st: DatabaseState, settings: Settings) -> Check:
    """The order a catch-up gives each aggregate's rows (cdc_outbox.cdc.catch_up_order)."""
    sequence = settings.columns.sequence
    if sequence is not None and st.table_oid is not None and sequence not in st.table_columns:
        return _check("catch_up_order", False, f"columns.sequence: no column {sequence!r}",
                      "fix columns.sequence or the table")  # fmt: skip
    key = order_key(settings, st.commit_timestamps)
    if key is None:
        return Check(
            "catch_up_order",
            True,
            "a catch-up orders each aggregate's rows by transaction id only: commit order only"
            " if each transaction writing an aggregate's events got its transaction id after"
            " the previous one committed",
            "set columns.sequence (a per-aggregate version or insert-timestamp column), or"
            " track_commit_timestamp = on (restart)",
            warning=True,
        )
    return _check("catch_up_order", True, f"a catch-up orders each aggregate's rows by {key}")


def _publication_check(st: DatabaseState, settings: Settings, table: str) -> Check:
    name, pub = settings.publication_name, st.publication
    if pub is None:
        can = (st.superuser or st.table_owned or st.table_oid is None) and st.can_create_in_db
        return _check("publication", can,
                      f"publication '{name}' will be created" if can else
                      f"publication '{name}' is missing and role '{st.user}' may not create it",
                      "run init as the outbox table's owner (or a superuser)")  # fmt: skip
    # Without publish_via_partition_root a partitioned table is listed (and streamed) as its
    # leaf partitions: the relay, which maps the outbox table's relation, would ignore them.
    leaves = st.table_partitioned and not pub.via_root
    covered = sorted(st.table_partitions) if leaves else [table]
    problems = []
    if pub.all_tables or sorted(pub.tables) != covered:
        problems.append(f"covers {'ALL TABLES' if pub.all_tables else ', '.join(pub.tables)}")
    if pub.operations != ["insert"]:
        problems.append(f"publishes {', '.join(pub.operations) or 'nothing'}")
    options = "publish = 'insert', publish_via_partition_root = true"
    fix = (
        f"`cdc-outbox drop --yes` then init again, or ALTER PUBLICATION {name} "
        f"SET TABLE {table}; ALTER PUBLICATION {name} SET ({options})"
    )
    if leaves:
        problems.append(
            f"lacks publish_via_partition_root ({table} is partitioned: its rows "
            "would be streamed under the partitions' names, which the relay ignores)"
        )
        if len(problems) == 1:
            fix = f"ALTER PUBLICATION {name} SET ({options})"
    return _check("publication", not problems,
                  f"publication '{name}' {' and '.join(problems)}; expected inserts of {table} only"
                  if problems else f"publication '{name}' publishes inserts of {table}", fix,
                  )  # fmt: skip


def _slot_check(st: DatabaseState, settings: Settings) -> Check:
    name, slot = settings.slot_name, st.slot
    if slot is None:
        return _check("slot", True, f"slot '{name}' will be created")
    if slot.slot_type != "logical" or slot.plugin != "pgoutput":
        return _check("slot", False,
                      f"slot '{name}' is {slot.slot_type}/{slot.plugin}, not logical/pgoutput",
                      "choose another slot_name, or drop that slot")  # fmt: skip
    if slot.database != st.database:
        return _check("slot", False, f"slot '{name}' belongs to database '{slot.database}'",
                      "choose another slot_name, or connect to that database")  # fmt: skip
    if slot.wal_status == "lost":
        return _check("slot", False, f"slot '{name}' was invalidated (wal_status lost)",
                      "`cdc-outbox drop --yes` then init; recover missed rows by polling",
                      )  # fmt: skip
    return _check("slot", True, f"slot '{name}' exists (pgoutput)")
