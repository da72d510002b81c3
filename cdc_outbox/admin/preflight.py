"""Preflight checks: is the server ready for the relay, and can ``init`` set it up?

:func:`preflight` inspects the server and returns :class:`Check` rows (never raises for a
failed check); ``init`` raises :class:`PreflightFailed` (exit 3) if any check failed.
"""

from __future__ import annotations

from cdc_outbox.admin.checks import Check
from cdc_outbox.admin.failover_checks import primary_failover_checks, table_less_checks
from cdc_outbox.config.settings import OutboxSettings, Settings
from cdc_outbox.errors import PreflightError
from cdc_outbox.store.inspection import Conn, DatabaseState, TableState, inspect_database
from cdc_outbox.store.outbox_table import OutboxTable

__all__ = [
    "MIN_SERVER_VERSION",
    "PreflightFailed",
    "evaluate_checks",
    "missing_from_publication",
    "preflight",
    "table_state",
]

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


def preflight(conn: Conn, settings: Settings, *, create_table: bool = False) -> list[Check]:
    """Readiness checks; names: server_version, wal_level, replication_privilege,
    replication_slots, wal_senders; per configured outbox table outbox_table, outbox_columns,
    catch_up_order (when the table exists or will be created), each detail naming the table;
    message_prefix_id (with ``message_prefix``); publication, slot; on PostgreSQL 17+
    failover_slot (when the slot exists) and synchronized_standby_slots (warnings only)."""
    return evaluate_checks(inspect_database(conn, settings), settings, create_table)


def _check(name: str, ok: bool, detail: str, fix: str = "") -> Check:
    return Check(name, ok, detail, "" if ok else fix)


def table_state(st: DatabaseState, outbox: OutboxSettings) -> TableState:
    """What ``st`` found of ``outbox`` (absent if it was not inspected)."""
    for ts in st.tables:
        if ts.name == outbox.name:
            return ts
    return TableState(outbox.schema_name, outbox.table, schema_exists=False,
                      can_create_in_schema=False)  # fmt: skip


def evaluate_checks(
    st: DatabaseState, settings: Settings, create_table: bool, *, adding: bool = False
) -> list[Check]:
    """The :func:`preflight` checks for an already inspected database; ``adding`` (``init``):
    configured tables the publication lacks will be added, so they are no failed check."""
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
    for outbox in settings.outbox_settings():
        checks += _table_checks(st, settings, outbox, create_table)
    if settings.message_prefix is not None:
        checks.append(_table_less_id_check(settings, table_state(st, settings.outbox())))
    checks.append(_publication_check(st, settings, adding))
    checks.append(_slot_check(st, settings))
    checks += primary_failover_checks(
        st.version_num, st.synchronized_standby_slots, st.slot_failover
    )
    if settings.message_prefix is not None:
        checks += table_less_checks(
            st.version_num, st.slot_failover, settings.slot_failover, st.max_slot_wal_keep_size_mb
        )
    return checks


def _table_checks(
    st: DatabaseState, settings: Settings, outbox: OutboxSettings, create_table: bool
) -> list[Check]:
    """outbox_table, outbox_columns and catch_up_order of one outbox table."""
    ts, table = table_state(st, outbox), outbox.name
    if ts.oid is not None:
        missing = [c for c in settings.column_names(outbox).row_columns() if c not in ts.columns]
        return [
            _check("outbox_table", True, f"table {table} exists"),
            _check("outbox_columns", not missing,
                   f"missing column(s): {', '.join(missing)} (table {table})" if missing
                   else f"all columns present (table {table})",
                   "fix the columns.* settings or the table"),
            _order_check(st, settings, outbox, ts),
        ]  # fmt: skip
    if create_table:
        if ts.schema_exists:
            ok = ts.can_create_in_schema
            detail = (f"table {table} will be created" if ok
                      else f"no CREATE privilege on schema {outbox.schema_name}")  # fmt: skip
        else:
            ok = st.can_create_in_db
            detail = (f"schema {outbox.schema_name} and table {table} will be created" if ok
                      else f"schema {outbox.schema_name} does not exist and role '{st.user}'"
                      " may not create it")  # fmt: skip
        return [
            _check("outbox_table", ok, detail, "run init as the schema owner (or create the"
                   f" schema {outbox.schema_name} first)"),
            _order_check(st, settings, outbox, ts),
        ]  # fmt: skip
    return [
        _check(
            "outbox_table",
            False,
            f"table {table} does not exist",
            "pass --create-table, or run the SQL that `cdc-outbox sql outbox` prints",
        )
    ]


#: Id column types a table-less event's UUID fits in (``format_type`` names).
_UUID_HOLDERS = ("uuid", "text", "character varying")


def _table_less_id_check(settings: Settings, ts: TableState) -> Check:
    """Table-less events are mapped like the first outbox's rows: its id column must hold
    their UUID event ids (uuid or text; varchar of 36 or more)."""
    column = settings.column_names(settings.outbox()).id
    kind = ts.id_type
    if kind is None:  # the table (or column) is missing or will be created: other checks
        return _check(
            "message_prefix_id", True, f"{ts.name}.{column} will be checked once it exists"
        )
    base, _, size = kind.partition("(")
    ok = base in _UUID_HOLDERS and (not size or int(size.rstrip(")")) >= 36)
    return _check("message_prefix_id", ok,
                  f"table-less events get UUID ids, mapped like {ts.name}'s rows: its id column"
                  f" {column} is {kind}",
                  f"make {ts.name}.{column} uuid or text, or list an outbox with such an id"
                  " column first")  # fmt: skip


def _order_check(
    st: DatabaseState, settings: Settings, outbox: OutboxSettings, ts: TableState
) -> Check:
    """The order a catch-up gives each aggregate's rows (cdc_outbox.cdc.catch_up_order)."""
    sequence = outbox.columns.sequence
    table = outbox.name
    if sequence is not None and ts.oid is not None and sequence not in ts.columns:
        return _check("catch_up_order", False, f"{table}: columns.sequence: no column"
                      f" {sequence!r}", "fix columns.sequence or the table")  # fmt: skip
    column = OutboxTable.of(settings, outbox).order_column
    if column is not None:
        key: str | None = f"column {column}"
    elif st.commit_timestamps:
        key = "commit timestamps (track_commit_timestamp)"
    else:
        key = None
    if key is None:
        return Check(
            "catch_up_order",
            True,
            f"{table}: a catch-up orders each aggregate's rows by transaction id only: commit"
            " order only if each transaction writing an aggregate's events got its transaction"
            " id after the previous one committed",
            "set columns.sequence (a per-aggregate version or insert-timestamp column), or"
            " track_commit_timestamp = on (restart)",
            warning=True,
        )
    return _check("catch_up_order", True, f"{table}: a catch-up orders each aggregate's rows"
                  f" by {key}")  # fmt: skip


def missing_from_publication(st: DatabaseState, settings: Settings) -> list[OutboxSettings]:
    """Configured outbox tables the existing publication does not list (``init`` adds them);
    [] when there is no publication, or it is FOR ALL TABLES."""
    pub = st.publication
    if pub is None or pub.all_tables:
        return []
    return [
        o for o in settings.outbox_settings()
        if not set(table_state(st, o).published_as(pub.via_root)) & set(pub.tables)
    ]  # fmt: skip


def _publication_check(st: DatabaseState, settings: Settings, adding: bool) -> Check:
    """``adding`` (``init``): configured tables missing from the publication are added, not
    a problem; otherwise (status, run) they are: their inserts would not be streamed."""
    name, pub = settings.publication_name, st.publication
    states = [table_state(st, o) for o in settings.outbox_settings()]
    tables = ", ".join(ts.name for ts in states)
    if pub is None:
        can = st.can_create_in_db and all(
            st.superuser or ts.owned or ts.oid is None for ts in states
        )
        return _check("publication", can,
                      f"publication '{name}' will be created" if can else
                      f"publication '{name}' is missing and role '{st.user}' may not create it",
                      "run init as the outbox tables' owner (or a superuser)")  # fmt: skip
    # Without publish_via_partition_root a partitioned table is listed (and streamed) as its
    # leaf partitions: the relay, which maps the outbox table's relation, would ignore them.
    expected = sorted(n for ts in states for n in ts.published_as(pub.via_root))
    missing = missing_from_publication(st, settings)
    extra = sorted(set(pub.tables) - set(expected))
    listed = set(pub.tables)
    partial = any(
        listed & set(names) and not listed >= set(names)
        for names in (ts.published_as(pub.via_root) for ts in states)
    )
    problems = []
    if pub.all_tables or extra or partial:
        problems.append(f"covers {'ALL TABLES' if pub.all_tables else ', '.join(pub.tables)}")
    if missing and not adding:
        problems.append(f"lacks {', '.join(o.name for o in missing)}")
    if pub.operations != ["insert"]:
        problems.append(f"publishes {', '.join(pub.operations) or 'nothing'}")
    options = "publish = 'insert', publish_via_partition_root = true"
    fix = (
        f"`cdc-outbox drop --yes` then init again, or ALTER PUBLICATION {name} "
        f"SET TABLE {tables}; ALTER PUBLICATION {name} SET ({options})"
    )
    if missing and problems == [f"lacks {', '.join(o.name for o in missing)}"]:
        fix = "run `cdc-outbox init` (it adds them)"
    partitioned = [ts.name for ts in states if ts.partitioned]
    if partitioned and not pub.via_root:
        problems.append(
            f"lacks publish_via_partition_root ({', '.join(partitioned)} is partitioned: its"
            " rows would be streamed under the partitions' names, which the relay ignores)"
        )
        if len(problems) == 1:
            fix = f"ALTER PUBLICATION {name} SET ({options})"
    if missing and adding and not problems:
        owned = all(st.superuser or table_state(st, o).owned for o in missing)
        return _check("publication", owned,
                      f"publication '{name}': {', '.join(o.name for o in missing)} will be added"
                      if owned else f"publication '{name}' lacks"
                      f" {', '.join(o.name for o in missing)} and role '{st.user}' may not add"
                      " them", "run init as the outbox tables' owner (or a superuser)")  # fmt: skip
    return _check("publication", not problems,
                  f"publication '{name}' {' and '.join(problems)}; expected inserts of {tables}"
                  " only" if problems else f"publication '{name}' publishes inserts of {tables}",
                  fix)  # fmt: skip


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
