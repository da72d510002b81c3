"""Is the cluster set up for failover slots (PostgreSQL 17+)? Pure: no I/O.

Inputs are the setting values read from the servers (:mod:`cdc_outbox.store.inspection`);
outputs are preflight :class:`~cdc_outbox.admin.preflight.Check` rows. A cluster not set
up for failover slots still runs the relay (after a failover it recreates the slot and catches
up), so on the primary an unset value is a ``warning``, never a failed check. On a standby
(``status --standby``) each check is ``ok`` only when that part is set up.

- primary: the slot has ``failover = true`` and ``synchronized_standby_slots`` names at least
  one physical slot (logical walsenders then wait for that standby: nothing is published that
  it lacks);
- table-less events (``message_prefix`` set; :func:`table_less_checks`): the WAL is their
  only copy, so a slot that is not a failover slot (17+), or that ``max_slot_wal_keep_size``
  may invalidate, can lose them: a ``warning`` each;
- standby: ``sync_replication_slots = on``, ``hot_standby_feedback = on``, a
  ``primary_slot_name``, a ``dbname`` in ``primary_conninfo``, and our slot there with
  ``synced = true``, no longer temporary (only such a slot is usable after promotion; a synced
  copy stays temporary until the primary's slot moved past where the copy started).
"""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict

from cdc_outbox.admin.checks import Check
from cdc_outbox.store.inspection import StandbyState
from cdc_outbox.store.schema import FAILOVER_SLOTS_VERSION

__all__ = ["primary_failover_checks", "standby_failover_checks", "table_less_checks"]


def primary_failover_checks(
    version_num: int, synchronized_standby_slots: str | None, slot_failover: bool | None
) -> list[Check]:
    """``failover_slot`` (``slot_failover``: the slot's ``failover`` column, None when there
    is no slot yet) and ``synchronized_standby_slots``; nothing before PostgreSQL 17."""
    if version_num < FAILOVER_SLOTS_VERSION:
        return []
    checks = []
    if slot_failover is False:
        checks.append(
            Check(
                "failover_slot",
                True,
                "the slot has failover = false: standbys do not synchronize it",
                "ALTER_REPLICATION_SLOT <slot> (FAILOVER true) on a replication connection",
                warning=True,
            )
        )
    elif slot_failover:
        checks.append(check("failover_slot", True, "the slot has failover = true"))
    names = [n.strip() for n in (synchronized_standby_slots or "").split(",") if n.strip()]
    if names:
        checks.append(
            check("synchronized_standby_slots", True, f"logical walsenders wait for {names}")
        )
    else:
        checks.append(
            Check(
                "synchronized_standby_slots",
                True,
                "synchronized_standby_slots is empty: events may be published that a"
                " standby lacks when it is promoted",
                "ALTER SYSTEM SET synchronized_standby_slots = '<physical slot of the standby>';"
                " SELECT pg_reload_conf()",
                warning=True,
            )
        )
    return checks


def table_less_checks(
    version_num: int, slot_failover: bool | None, create_failover: bool, keep_size_mb: int
) -> list[Check]:
    """Warnings for table-less events: ``slot_failover`` as in :func:`primary_failover_checks`
    (``create_failover``: the ``slot_failover`` setting, for a slot not created yet), and
    ``max_slot_wal_keep_size`` in MB (-1: unlimited)."""
    lost = "table-less events (message_prefix) live only in the WAL: "
    checks = []
    if (
        version_num < FAILOVER_SLOTS_VERSION
        or slot_failover is False
        or (slot_failover is None and not create_failover)
    ):
        checks.append(
            Check(
                "table_less_failover",
                True,
                lost + "the slot is not a failover slot, so a failover to a standby loses the"
                " events the relay had not confirmed (there is no catch-up for them)",
                "PostgreSQL 17+ with slot_failover = true and sync_replication_slots on the"
                " standbys (docs/failover.md)",
                warning=True,
            )
        )
    if keep_size_mb >= 0:
        checks.append(
            Check(
                "table_less_wal_keep",
                True,
                lost + f"max_slot_wal_keep_size = {keep_size_mb}MB invalidates a slot that far"
                " behind, and the events it had not confirmed are lost",
                "ALTER SYSTEM SET max_slot_wal_keep_size = -1 (watch disk space instead), or"
                " a size the relay can never lag by",
                warning=True,
            )
        )
    return checks


def check(name: str, ok: bool, detail: str, fix: str = "") -> Check:
    """A check whose ``fix`` is kept only when it failed."""
    return Check(name, ok, detail, "" if ok else fix)


def standby_failover_checks(st: StandbyState, slot_name: str) -> list[Check]:
    """One check per setting a failover slot needs on this standby, then the slot itself."""
    if not st.in_recovery:
        return [check("standby", False, "the server is not a standby (not in recovery)",
                      "pass the DSN of a standby to --standby")]  # fmt: skip
    if st.version_num < FAILOVER_SLOTS_VERSION:
        return [check("standby", False,
                      f"PostgreSQL {st.version_num // 10000} has no failover slots (17+)",
                      "upgrade the cluster to PostgreSQL 17 or later")]  # fmt: skip
    try:
        dbname = conninfo_to_dict(st.primary_conninfo).get("dbname")
    except psycopg.ProgrammingError:  # unparsable: no dbname
        dbname = None
    reload = "; SELECT pg_reload_conf()"
    return [
        check("sync_replication_slots", st.sync_replication_slots == "on",
              f"sync_replication_slots is {st.sync_replication_slots}",
              "ALTER SYSTEM SET sync_replication_slots = on" + reload),
        check("hot_standby_feedback", st.hot_standby_feedback == "on",
              f"hot_standby_feedback is {st.hot_standby_feedback}",
              "ALTER SYSTEM SET hot_standby_feedback = on" + reload),
        check("primary_slot_name", bool(st.primary_slot_name),
              f"primary_slot_name is {st.primary_slot_name or 'empty'}",
              "create a physical slot on the primary and set primary_slot_name to it"),
        check("primary_conninfo_dbname", bool(dbname),
              f"primary_conninfo {'names dbname ' + str(dbname) if dbname else 'has no dbname'}",
              "add dbname=<database> to primary_conninfo" + reload),
        check("slot_synced", st.slot_synced is True,
              f"slot '{slot_name}' " + ("is synchronized (synced = true)" if st.slot_synced
                                         else "is not synchronized (synced = false, or"
                                              " still temporary)"
                                         if st.slot_synced is False else "does not exist here"),
              "create the slot with failover (slot_failover = true, PostgreSQL 17+) and set up"
              " the settings above; SELECT pg_sync_replication_slots() forces a sync"),
    ]  # fmt: skip
