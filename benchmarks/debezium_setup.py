"""What ``python -m benchmarks debezium`` runs, as text: pure, no server, no JVM.

The Kafka Connect worker and Debezium connector properties (:func:`worker_properties`,
:func:`connector_properties`), in two variants (:data:`VARIANTS`: Debezium's defaults, and
tuned for throughput with :data:`TUNED`), cdc-outbox's TOML for ``python -m cdc_outbox run``
(:func:`relay_toml`), and the server-side burst that commits a phase's events
(:func:`burst_sql`). Both systems read the same outbox table (the ``debezium`` layout) from
slots of their own and route ``aggregatetype`` to ``PREFIX.<aggregatetype>``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

#: The connector's settings that the throughput tuning changes, and Debezium's defaults for
#: them (Debezium 3.6 documentation; Kafka 4.1's producer defaults: linger.ms 5, batch.size
#: 16384). Connector keys as such, ``producer.*`` keys go to the worker.
DEFAULTS: dict[str, str] = {
    "max.batch.size": "2048",
    "max.queue.size": "8192",
    "poll.interval.ms": "500",
    "producer.linger.ms": "5",
    "producer.batch.size": "16384",
}
#: Debezium tuned for throughput: 4x the batch, a queue of 4 batches, no 500 ms sleep when the
#: queue is empty, and the producer's batches grown to hold a whole connector batch per
#: partition (512 KiB; linger 20 ms lets them fill under load).
TUNED: dict[str, str] = {
    "max.batch.size": "8192",
    "max.queue.size": "32768",
    "poll.interval.ms": "10",
    "producer.linger.ms": "20",
    "producer.batch.size": "524288",
}
#: variant name -> the settings of :data:`DEFAULTS` it overrides (none: Debezium as shipped).
VARIANTS: dict[str, dict[str, str]] = {"debezium_default": {}, "debezium_tuned": TUNED}

CONNECTOR_NAME = "bench-outbox"


def render_properties(props: Mapping[str, str]) -> str:
    """``key=value`` lines (a ``\\`` in a value doubled, as ``.properties`` files escape it)."""
    return "".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in props.items())


def worker_properties(bootstrap: str, rest_port: int, tuning: Mapping[str, str]) -> str:
    """A standalone worker's properties; ``{plugin_path}`` and ``{offsets}`` are left for
    :class:`~cdc_outbox_dev.sandbox.kafka_connect.LocalConnect` to fill. Only ``tuning``'s
    ``producer.*`` keys are written (unset: the producer's own defaults)."""
    props = {
        "bootstrap.servers": bootstrap,
        "listeners": f"http://127.0.0.1:{rest_port}",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        "offset.storage.file.filename": "{offsets}",
        "plugin.path": "{plugin_path}",
        **{k: v for k, v in tuning.items() if k.startswith("producer.")},
    }
    return render_properties(props)


def connector_properties(
    dsn: str,
    *,
    slot: str,
    publication: str,
    table: str,
    topic_prefix: str,
    tuning: Mapping[str, str],
    schema: str = "public",
) -> str:
    """The Debezium PostgreSQL connector with the outbox ``EventRouter``: pgoutput from the
    existing ``slot`` and ``publication`` (neither created nor dropped by Debezium), no
    snapshot, key = ``aggregateid``, value = ``payload`` as stored, topic
    ``TOPIC_PREFIX.<aggregatetype>``; ``tuning``'s connector keys on top."""
    conn = conninfo_to_dict(dsn)
    props = {
        "name": CONNECTOR_NAME,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": str(conn.get("host") or "127.0.0.1"),
        "database.port": str(conn.get("port") or "5432"),
        "database.user": str(conn.get("user") or "postgres"),
        "database.dbname": str(conn.get("dbname") or "postgres"),
        **({"database.password": str(conn["password"])} if conn.get("password") else {}),
        "topic.prefix": topic_prefix,
        "slot.name": slot,
        "publication.name": publication,
        "publication.autocreate.mode": "disabled",
        "snapshot.mode": "no_data",
        "table.include.list": f"{schema}.{table}",
        "tombstones.on.delete": "false",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.route.topic.replacement": topic_prefix + ".${routedByValue}",
        **{k: v for k, v in tuning.items() if not k.startswith("producer.")},
    }
    return render_properties(props)


def relay_toml(
    dsn: str, bootstrap: str, *, slot: str, publication: str, table: str, topic_prefix: str
) -> str:
    """cdc-outbox's ``--config`` file: CDC, the ``debezium`` preset, defaults otherwise but no
    metrics endpoint and a 60 s leader lease (high availability only, not on the data path)."""
    values = {
        "mode": "cdc",
        "dsn": dsn,
        "slot_name": slot,
        "publication_name": publication,
        "outbox_table": table,
        "topic_template": topic_prefix + ".{aggregate_type}",
        "metrics_port": 0,
        # The warm drain pauses the reader while its burst commits (seconds on a loaded
        # machine): with the default 5 s lease a paused leader could find its lease lost.
        "leader_lease_s": 60.0,
    }
    lines = [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    lines += ["", "[columns]", 'preset = "debezium"', "", "[kafka]"]
    lines.append(f"bootstrap_servers = {json.dumps(bootstrap)}")
    return "\n".join(lines) + "\n"


def burst_sql(table: str, aggregate_type: str, events: int, txn_size: int) -> sql.Composed:
    """A ``DO`` block that commits ``events`` outbox rows of ``aggregate_type`` in
    transactions of ``txn_size`` rows, server-side (no client round trip between commits):
    the events are committed as fast as PostgreSQL can, so a drain measures the reader.
    Payloads are the workload's shape (``order``, ``seq``, ``amount_cents``, a 120-char
    ``note``) over 200 aggregates. Run it outside a transaction block (autocommit)."""
    body = sql.SQL(
        "DO $burst$ DECLARE done int := 0; n int; BEGIN"
        " WHILE done < {events} LOOP"
        " n := least({size}, {events} - done);"
        " INSERT INTO {table} (aggregatetype, aggregateid, type, payload)"
        " SELECT {agg}, 'order-' || (i % 200), 'OrderPlaced',"
        " jsonb_build_object('order', 'order-' || (i % 200), 'seq', i / 200,"
        " 'amount_cents', 1000 + i, 'note', repeat('x', 120))"
        " FROM generate_series(done, done + n - 1) AS i;"
        " done := done + n; COMMIT; END LOOP; END $burst$"
    )
    return body.format(
        events=sql.Literal(events),
        size=sql.Literal(txn_size),
        table=sql.Identifier(table),
        agg=sql.Literal(aggregate_type),
    )
