"""Inspected database states for the preflight verdict tests (pure: no server)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import SecretStr

from cdc_outbox.config.settings import Settings
from cdc_outbox.store.inspection import DatabaseState, PublicationStatus, TableState

SETTINGS = Settings(dsn=SecretStr("host=db.example dbname=shop"))
COLUMNS = {"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers"}
LEAVES = ["public.outbox_2025", "public.outbox_2026"]


def ready(**changes: Any) -> DatabaseState:
    """A PostgreSQL 15 ready for the relay: outbox table, publication; the slot is missing.
    ``table_<field>`` changes the outbox table's :class:`TableState` field."""
    table = {
        k.removeprefix("table_"): changes.pop(k) for k in list(changes) if k.startswith("table_")
    }
    table = {"oid": 16384, "owned": True, "columns": set(COLUMNS), "id_type": "uuid", **table}
    state = DatabaseState(
        version_num=150013,
        version="15.13",
        wal_level="logical",
        max_slots=10,
        used_slots=0,
        max_senders=10,
        used_senders=0,
        superuser=False,
        replication=True,
        user="owner",
        database="shop",
        can_create_in_db=True,
        tables=[TableState("public", "outbox", **table)],
        publication=PublicationStatus("cdc_outbox_pub", ["public.outbox"], ["insert"], False),
    )
    return dataclasses.replace(state, **changes)
