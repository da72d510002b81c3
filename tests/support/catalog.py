"""PostgreSQL catalog reads and CLI flags for the admin CLI tests (init/status/drop)."""

from __future__ import annotations

from typing import Any

import psycopg


def query(dsn: str, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run ``text`` (several statements allowed without params); rows of the last one."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(text, params or None)
        return cur.fetchall() if cur.description is not None else []


def flags(names: dict[str, str]) -> list[str]:
    """``--slot``/``--publication`` CLI flags for a test's unique ``names``."""
    return ["--slot", names["slot"], "--publication", names["publication"]]


def slot_row(dsn: str, slot: str) -> list[tuple[Any, ...]]:
    """The row of ``slot`` in pg_replication_slots ([] when it does not exist)."""
    return query(
        dsn,
        "SELECT slot_name, plugin, database, restart_lsn::text, confirmed_flush_lsn::text,"
        " catalog_xmin::text FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )


def publication_row(dsn: str, pub: str) -> list[tuple[Any, ...]]:
    """``pub``'s flags and tables ([] when it does not exist)."""
    return query(
        dsn,
        "SELECT p.oid, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate,"
        " array_agg(t.schemaname || '.' || t.tablename)"
        " FROM pg_publication p LEFT JOIN pg_publication_tables t ON t.pubname = p.pubname"
        " WHERE p.pubname = %s GROUP BY 1, 2, 3, 4, 5",
        (pub,),
    )
