"""Dev tool: capture real pgoutput frames from PostgreSQL into ``frames.json``.

Not run by the test suite; the JSON it writes is committed test data. Re-run it only when the
SQL script below changes, then re-check tests/unit/test_pgoutput.py (OIDs, xids and LSNs are
recorded in ``meta`` so the tests do not hard-code them).

Needs a throw-away PostgreSQL 15+ with ``wal_level = logical`` and a superuser reachable over
TCP with trust (including ``host replication``) in pg_hba.conf, for example (as root)::

    D=/tmp/golden_pg; mkdir -p $D; chown postgres $D
    PGBIN=/usr/lib/postgresql/15/bin
    runuser -u postgres -- $PGBIN/initdb -D $D/data -U postgres --auth=trust
    printf "wal_level=logical\\nport=54999\\nlisten_addresses='127.0.0.1'\\n" \\
        >> $D/data/postgresql.conf
    printf "host all all 127.0.0.1/32 trust\\nhost replication all 127.0.0.1/32 trust\\n" \\
        > $D/data/pg_hba.conf
    runuser -u postgres -- $PGBIN/pg_ctl -D $D/data -l $D/log -w start
    python tests/unit/golden/capture_frames.py --dsn "host=127.0.0.1 port=54999 user=postgres"
    runuser -u postgres -- $PGBIN/pg_ctl -D $D/data -m fast stop

It (re)creates the database ``golden_capture``, runs :data:`SETUP` and :data:`V1_SCRIPT`, and
reads slot ``golden`` with proto_version 1 (messages on) up to the end-marker message. Then it
runs :data:`STREAM_SCRIPT` and reads slot ``golden_stream`` with proto_version 2, streaming and
binary on and ``logical_decoding_work_mem=64kB`` so big transactions are streamed. Both
replication connections use TimeZone=UTC. Every CopyData message is stored whole (XLogData 'w'
header + pgoutput payload, or keepalive 'k') as
hex, with ``kind`` = the pgoutput message type byte (or ``"keepalive"``).
"""

from __future__ import annotations

import argparse
import json
import select
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq

DB = "golden_capture"
END_MARKER = b"golden\x00\x00\x00\x00\x03end"  # prefix, NUL, Int32 length, content

SETUP = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE outbox (
    id uuid PRIMARY KEY,
    aggregate_type text,
    aggregate_id text,
    event_type text,
    payload jsonb,
    headers jsonb DEFAULT '{}',
    created_at timestamptz DEFAULT now(),
    status text DEFAULT 'PENDING',
    attempts int DEFAULT 0,
    available_at timestamptz DEFAULT now(),
    locked_at timestamptz,
    locked_by text,
    published_at timestamptz,
    last_error text
);
-- fixed defaults instead of now(): captured frames stay the same on every run
ALTER TABLE outbox ALTER COLUMN created_at SET DEFAULT '2024-01-02 03:04:05+00',
    ALTER COLUMN available_at SET DEFAULT '2024-01-02 03:04:05+00';
CREATE TABLE item (
    id int PRIMARY KEY, name text NOT NULL, feeling mood, doc text, price numeric(10, 2),
    note text
);
ALTER TABLE item ALTER COLUMN doc SET STORAGE EXTERNAL;
CREATE TABLE audit (id bigint, actor text, detail jsonb);
ALTER TABLE audit REPLICA IDENTITY FULL;
CREATE TABLE bulk (id int PRIMARY KEY, v text);
CREATE PUBLICATION p FOR TABLE outbox, item, audit, bulk;
"""
SLOT = "SELECT pg_create_logical_replication_slot('golden', 'pgoutput');"
ORIGIN = "SELECT pg_replication_origin_create('golden_origin');"

V1_SCRIPT = [
    # 1. two outbox rows and a transactional message in one transaction
    """BEGIN;
    INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
    VALUES
      ('00000000-0000-4000-8000-000000000001', 'order', 'order-42', 'OrderPlaced',
       '{"total": 12.5, "items": ["a", "b"], "note": "ünïcode"}',
       '{"trace_id": "abc123", "attempt": 1, "nested": {"a": [1, 2]}}'),
      ('00000000-0000-4000-8000-000000000002', 'order', 'order-42', 'OrderPaid', '{}', '{}');
    SELECT pg_logical_emit_message(true, 'cdc', 'hello');
    COMMIT;""",
    # 2. outbox rows that must dead-letter: NULL payload/headers, headers not an object
    """INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
    VALUES
      ('00000000-0000-4000-8000-000000000003', 'order', NULL, 'Broken', NULL, NULL),
      ('00000000-0000-4000-8000-000000000004', 'order', 'order-7', 'Odd', '[1, 2]', '[1]');""",
    # 3. TOASTed value (STORAGE EXTERNAL: out of line, uncompressed), NULL, custom type
    "INSERT INTO item VALUES (1, 'widget', 'happy', repeat('0123456789', 500), 9.99, NULL);",
    # 4. UPDATE not touching the TOASTed column -> 'u' in the new tuple
    "UPDATE item SET price = 10.50 WHERE id = 1;",
    # 5. UPDATE of the primary key -> 'K' old key tuple
    "UPDATE item SET id = 2, name = 'gadget' WHERE id = 1;",
    # 6. REPLICA IDENTITY FULL -> 'O' old tuples on UPDATE and DELETE
    """BEGIN;
    INSERT INTO audit VALUES (1, 'alice', '{"x": 1}');
    UPDATE audit SET actor = 'bob' WHERE id = 1;
    DELETE FROM audit WHERE id = 1;
    COMMIT;""",
    # 7. DELETE with default replica identity -> 'K' with only the key column set
    "DELETE FROM item WHERE id = 2;",
    # 8. TRUNCATE of two relations with RESTART IDENTITY, then a plain one
    "INSERT INTO item VALUES (3, 'x', NULL, NULL, NULL, NULL);",
    "TRUNCATE item, audit RESTART IDENTITY;",
    "TRUNCATE audit;",
    # 9. rolled back: nothing but the non-transactional message is sent
    """BEGIN;
    INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
      VALUES ('00000000-0000-4000-8000-0000000000ff', 'order', 'o', 'Gone', '{}');
    SELECT pg_logical_emit_message(true, 'cdc', 'rolled back');
    SELECT pg_logical_emit_message(false, 'cdc', 'non-transactional');
    ROLLBACK;""",
    # 10. schema change: a new Relation message precedes the next insert
    "ALTER TABLE outbox ADD COLUMN tenant text;",
    """INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, tenant)
      VALUES ('00000000-0000-4000-8000-000000000005', 'customer', 'c-1', 'CustomerCreated',
              '{"name": "Ann"}', 'acme');""",
    # 11. a transaction replayed from a replication origin -> 'O' Origin message
    """SELECT pg_replication_origin_session_setup('golden_origin');
    BEGIN;
    SELECT pg_replication_origin_xact_setup('0/ABCDEF', '2024-01-02 00:00:00+00');
    INSERT INTO audit VALUES (2, 'origin', NULL);
    COMMIT;
    SELECT pg_replication_origin_session_reset();""",
    "SELECT pg_logical_emit_message(true, 'golden', 'end');",
]

STREAM_SCRIPT = [
    "SELECT pg_create_logical_replication_slot('golden_stream', 'pgoutput');",
    """BEGIN;
    INSERT INTO bulk SELECT g, 'row ' || g FROM generate_series(1, 600) g;
    SELECT pg_logical_emit_message(true, 'cdc', 'in stream');
    COMMIT;""",
    """BEGIN;
    INSERT INTO bulk SELECT g, NULL FROM generate_series(1001, 1500) g;
    ROLLBACK;""",
    "SELECT pg_logical_emit_message(true, 'golden', 'end');",
]


def _frame_kind(data: bytes) -> str:
    if data[:1] == b"k":
        return "keepalive"
    if data[:1] == b"w":
        return chr(data[25])
    raise SystemExit(f"unexpected CopyData type {data[:1]!r}")


def read_frames(conninfo: str, slot: str, options: str, timeout: float = 30.0) -> list[bytes]:
    """Stream ``slot`` from 0/0 until the end-marker message; return every CopyData message."""
    conn = pq.PGconn.connect(conninfo.encode())
    if conn.status != pq.ConnStatus.OK:
        raise SystemExit(conn.error_message.decode())
    res = conn.exec_(f"START_REPLICATION SLOT {slot} LOGICAL 0/0 ({options})".encode())
    if res.status != pq.ExecStatus.COPY_BOTH:
        raise SystemExit(conn.error_message.decode())
    frames: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            n, mv = conn.get_copy_data(1)
            if n == 0:
                if time.monotonic() > deadline:
                    raise SystemExit(f"no end marker within {timeout}s on {slot}")
                select.select([conn.socket], [], [], 1.0)
                conn.consume_input()
                continue
            if n < 0:
                raise SystemExit("replication stream ended early")
            data = bytes(mv)
            frames.append(data)
            if data[:1] == b"w" and data[25:26] == b"M" and END_MARKER in data:
                return frames
    finally:
        conn.finish()


def _run(conn: psycopg.Connection[Any], statements: list[str]) -> None:
    for stmt in statements:
        conn.execute(stmt.encode())  # simple query protocol: several statements allowed


def _frames_json(frames: list[bytes]) -> list[dict[str, str]]:
    return [{"kind": _frame_kind(f), "copy_data": f.hex()} for f in frames]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default="host=127.0.0.1 port=54999 user=postgres dbname=postgres")
    ap.add_argument("--out", default=str(Path(__file__).with_name("frames.json")))
    args = ap.parse_args()

    with psycopg.connect(args.dsn, autocommit=True) as admin:
        for slot in ("golden", "golden_stream"):
            admin.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (slot,),
            )
        admin.execute(f"DROP DATABASE IF EXISTS {DB}".encode())
        admin.execute(f"CREATE DATABASE {DB}".encode())
        version = admin.execute("SHOW server_version").fetchone()
    db_dsn = f"{args.dsn} dbname={DB}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        if conn.execute("SELECT count(*) FROM pg_replication_origin").fetchone() != (0,):
            conn.execute("SELECT pg_replication_origin_drop('golden_origin')")
        _run(conn, [SETUP, SLOT, ORIGIN])
        _run(conn, V1_SCRIPT)
        v1 = read_frames(
            f"{db_dsn} replication=database options='-c TimeZone=UTC'",
            "golden",
            "proto_version '1', publication_names 'p', messages 'true'",
        )
        _run(conn, STREAM_SCRIPT)
        v2 = read_frames(
            f"{db_dsn} replication=database"
            " options='-c TimeZone=UTC -c logical_decoding_work_mem=64kB'",
            "golden_stream",
            "proto_version '2', publication_names 'p', messages 'true', streaming 'on',"
            " binary 'true'",
        )
        rels = conn.execute(
            "SELECT relname, oid::int8 FROM pg_class WHERE relname = ANY(%s)",
            (["outbox", "item", "audit", "bulk"],),
        ).fetchall()
        mood = conn.execute("SELECT 'mood'::regtype::oid::int8").fetchone()
        for slot in ("golden", "golden_stream"):
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute("SELECT pg_replication_origin_drop('golden_origin')")
    doc = {
        "meta": {
            "server_version": version[0] if version else None,
            "relation_oids": {name: oid for name, oid in rels},
            "mood_type_oid": mood[0] if mood else None,
        },
        "v1": _frames_json(v1),
        "v2_stream": _frames_json(v2),
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(v1)} v1 + {len(v2)} v2 frames to {args.out}")


if __name__ == "__main__":
    main()
