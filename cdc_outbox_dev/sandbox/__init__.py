"""Local services for tests, the demo and benchmarks: one module, reused everywhere.

In-process use (servers stop and their temporary directories vanish on exit)::

    with LocalPostgres() as pg, LocalKafka() as kafka:
        ...  # pg.dsn, kafka.bootstrap_servers

Background use (servers outlive the caller; state in ``state_dir/sandbox.json``)::

    info = up()          # idempotent; info.dsn, info.bootstrap_servers, info.registry_url,
                         # info.export_line(); up(brokers=3): a three-node Kafka cluster
    status()             # SandboxInfo or None
    down(purge=True)     # stop all three; purge deletes their data

With ``brokers=3`` (``cdc-outbox sandbox up --brokers 3``) Kafka is a ``LocalKafkaCluster`` in
``state_dir/kafka-cluster`` (replication factor 3, ``min.insync.replicas=2``) instead of one
broker in ``state_dir/kafka``; ``status`` and ``down`` find whichever the directory holds.
The background sandbox also runs a schema registry (Apicurio, ``registry.LocalRegistry``,
durable on 3.x) for ``value_format = "avro"``.
"""

from __future__ import annotations

import json
import shlex
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_outbox_dev.sandbox.kafka import LocalKafka, cache_root, ensure_kafka_jars
from cdc_outbox_dev.sandbox.kafka_cluster import LocalKafkaCluster
from cdc_outbox_dev.sandbox.postgres import LocalPostgres
from cdc_outbox_dev.sandbox.redis import LocalRedis
from cdc_outbox_dev.sandbox.registry import LocalRegistry

__all__ = [
    "LocalKafka",
    "LocalKafkaCluster",
    "LocalPostgres",
    "LocalRedis",
    "LocalRegistry",
    "SandboxInfo",
    "default_state_dir",
    "down",
    "ensure_kafka_jars",
    "status",
    "up",
]

STATE_FILE = "sandbox.json"


@dataclass(frozen=True)
class SandboxInfo:
    """Where the background sandbox servers are and whether they run."""

    state_dir: Path
    dsn: str
    bootstrap_servers: str
    postgres_port: int
    postgres_pid: int | None
    postgres_datadir: Path
    kafka_port: int
    kafka_controller_port: int
    kafka_pid: int | None
    kafka_dir: Path
    registry_url: str = ""
    registry_pid: int | None = None
    kafka_brokers: int = 1

    @property
    def running(self) -> bool:
        """True when all servers run."""
        return None not in (self.postgres_pid, self.kafka_pid, self.registry_pid)

    def export_line(self) -> str:
        """A shell line pointing cdc-outbox at the sandbox."""
        line = (
            f"export CDC_OUTBOX_DSN={shlex.quote(self.dsn)}"
            f" CDC_OUTBOX_KAFKA__BOOTSTRAP_SERVERS={shlex.quote(self.bootstrap_servers)}"
        )
        if self.registry_url:
            line += f" CDC_OUTBOX_SCHEMA_REGISTRY__URL={shlex.quote(self.registry_url)}"
        return line

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (paths as strings)."""
        return {
            "state_dir": str(self.state_dir),
            "dsn": self.dsn,
            "bootstrap_servers": self.bootstrap_servers,
            "postgres": {
                "port": self.postgres_port,
                "pid": self.postgres_pid,
                "datadir": str(self.postgres_datadir),
            },
            "kafka": {
                "port": self.kafka_port,
                "controller_port": self.kafka_controller_port,
                "pid": self.kafka_pid,
                "dir": str(self.kafka_dir),
                "brokers": self.kafka_brokers,
            },
            "registry": {"url": self.registry_url, "pid": self.registry_pid},
        }


def default_state_dir() -> Path:
    """``$CDC_OUTBOX_CACHE_DIR/sandbox`` (default ``~/.cache/cdc-outbox/sandbox``)."""
    return cache_root() / "sandbox"


Kafka = LocalKafka | LocalKafkaCluster
CLUSTER_DIR = "kafka-cluster"


def _brokers_in(state_dir: Path) -> int:
    """How many Kafka nodes the sandbox in ``state_dir`` has (1 if none yet)."""
    nodes = list((state_dir / CLUSTER_DIR).glob("node-*"))
    return len(nodes) or 1


def _servers(
    state_dir: Path, brokers: int | None = None
) -> tuple[LocalPostgres, Kafka, LocalRegistry]:
    n = brokers or _brokers_in(state_dir)
    kafka: Kafka = (
        LocalKafkaCluster(state_dir / CLUSTER_DIR, n=n)
        if n > 1
        else LocalKafka(state_dir / "kafka")
    )
    return (
        LocalPostgres(state_dir / "postgres"),
        kafka,
        LocalRegistry(state_dir / "registry", durable=True),
    )


def _info(state_dir: Path, pg: LocalPostgres, kafka: Kafka, registry: LocalRegistry) -> SandboxInfo:
    return SandboxInfo(
        state_dir=state_dir,
        dsn=pg.dsn,
        bootstrap_servers=kafka.bootstrap_servers,
        postgres_port=pg.port,
        postgres_pid=pg.pid,
        postgres_datadir=pg.datadir,
        kafka_port=kafka.port,
        kafka_controller_port=kafka.controller_port,
        kafka_pid=kafka.pid,
        kafka_dir=kafka.base_dir,
        registry_url=registry.url,
        registry_pid=registry.pid,
        kafka_brokers=len(kafka.nodes) if isinstance(kafka, LocalKafkaCluster) else 1,
    )


def up(state_dir: Path | None = None, brokers: int | None = None) -> SandboxInfo:
    """Start PostgreSQL, Kafka (``brokers`` nodes; default: as before, else 1) and the schema
    registry in the background (no-op for those already running). ``RuntimeError`` when the
    sandbox already has another number of Kafka nodes, or ``brokers`` is 2 (replication
    factor 3 needs three)."""
    state_dir = (state_dir or default_state_dir()).absolute()
    if brokers == 2 or (brokers is not None and brokers < 1):
        raise RuntimeError("--brokers must be 1, or 3 or more (replication factor 3)")
    existing = _brokers_in(state_dir)
    if brokers is not None and (state_dir / STATE_FILE).exists() and brokers != existing:
        raise RuntimeError(
            f"the sandbox in {state_dir} has {existing} Kafka broker(s), not {brokers};"
            " run `cdc-outbox sandbox down --purge` first"
        )
    state_dir.mkdir(parents=True, exist_ok=True)
    pg, kafka, registry = _servers(state_dir, brokers)
    with ThreadPoolExecutor(max_workers=3) as pool:  # the JVMs' start-up dominates
        started = [pool.submit(pg.start), pool.submit(kafka.start), pool.submit(registry.start)]
    for future in started:
        future.result()
    info = _info(state_dir, pg, kafka, registry)
    (state_dir / STATE_FILE).write_text(json.dumps(info.to_json(), indent=2) + "\n")
    return info


def status(state_dir: Path | None = None) -> SandboxInfo | None:
    """Current state of the sandbox in ``state_dir`` (None if it was never brought up)."""
    state_dir = (state_dir or default_state_dir()).absolute()
    if not (state_dir / STATE_FILE).exists():
        return None
    return _info(state_dir, *_servers(state_dir))


def down(state_dir: Path | None = None, purge: bool = False) -> None:
    """Stop the servers; with ``purge`` also delete their data and the state directory."""
    state_dir = (state_dir or default_state_dir()).absolute()
    if not state_dir.exists():
        return
    pg, kafka, registry = _servers(state_dir)
    registry.stop()
    kafka.stop()
    pg.stop()
    if purge:
        registry.destroy()
        kafka.destroy()
        pg.destroy()
        shutil.rmtree(state_dir, ignore_errors=True)
