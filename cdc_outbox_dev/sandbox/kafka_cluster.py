"""A local three-node Apache Kafka cluster (KRaft, combined broker+controller), for the faults of
a replicated production cluster: a partition leader dying, the transaction coordinator moving,
the controller quorum losing a member, two of three nodes down, a rolling restart.

Each node is a ``LocalKafka`` (same Maven jars, CDS archive and lean JVM flags) with its own
``node.id``, ports and data directory under ``base_dir/node-<id>``; every node lists the same
static ``controller.quorum.voters`` and is formatted with the same cluster id (kept in
``base_dir/cluster.id``). Replication is production-like (:data:`CLUSTER_SETTINGS`):
replication factor 3, ``min.insync.replicas=2`` (the transaction log too), unclean leader
election off. With ``acks=all`` a write then needs two live replicas: with two nodes down,
produce requests fail or time out (retriable) and the quorum has no leader until one returns.

``start()`` starts the stopped nodes in parallel and returns once metadata shows every broker;
``kill(node)`` is SIGKILL, ``stop(node)`` a graceful (controlled) shutdown. Node ids are 1..n.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import struct
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from cdc_outbox_dev.sandbox import _proc
from cdc_outbox_dev.sandbox._lifecycle import LocalServer
from cdc_outbox_dev.sandbox.kafka import LocalKafka, _recv_exact, new_cluster_id

__all__ = ["CLUSTER_SETTINGS", "LocalKafkaCluster", "find_coordinator"]

logger = logging.getLogger(__name__)

#: Broker settings of every node, on top of ``kafka.DEFAULT_BROKER_SETTINGS``.
CLUSTER_SETTINGS: dict[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "unclean.leader.election.enable": "false",
    # A follower that stops fetching leaves the ISR after 10 s (default 30 s).
    "replica.lag.time.max.ms": "10000",
    "num.io.threads": "2",
}

#: FindCoordinator key types.
GROUP, TRANSACTION = 0, 1


class LocalKafkaCluster(LocalServer):
    """``n`` local KRaft nodes forming one cluster; ``with LocalKafkaCluster() as c:``.

    ``base_dir=None`` uses a temporary directory that ``close()`` deletes; an explicit one keeps
    data, ports and the cluster id, so a later instance re-attaches to nodes running there.
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        n: int = 3,
        broker_settings: dict[str, str] | None = None,
    ) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = (
            Path(tempfile.mkdtemp(prefix="cdc-outbox-kafka-cluster-"))
            if base_dir is None
            else base_dir
        ).absolute()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        id_file = self.base_dir / "cluster.id"
        if not id_file.exists():
            id_file.write_text(new_cluster_id() + "\n")
        self.cluster_id = id_file.read_text().strip()
        settings = {**CLUSTER_SETTINGS, **(broker_settings or {})}
        self.nodes: dict[int, LocalKafka] = {
            node_id: LocalKafka(
                self.base_dir / f"node-{node_id}",
                broker_settings=settings,
                node_id=node_id,
                cluster_id=self.cluster_id,
            )
            for node_id in range(1, n + 1)
        }
        # Ports come from each node's saved config or are fresh; fresh ones must not collide.
        taken: set[int] = set()
        for node in self.nodes.values():
            if node.port in taken:
                node.port = _fresh_port(taken)
            taken.add(node.port)
            while node.controller_port in taken:
                node.controller_port = _fresh_port(taken)
            taken.add(node.controller_port)
        voters = ",".join(f"{i}@127.0.0.1:{node.controller_port}" for i, node in self.nodes.items())
        for node in self.nodes.values():
            node.quorum_voters = voters

    # -- addresses -----------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        """The PLAINTEXT listeners of all nodes, comma-separated."""
        return ",".join(node.bootstrap_servers for node in self.nodes.values())

    @property
    def port(self) -> int:
        """PLAINTEXT port of node 1 (for a one-line summary)."""
        return self.nodes[1].port

    @property
    def controller_port(self) -> int:
        return self.nodes[1].controller_port

    @property
    def pid(self) -> int | None:
        """Pid of node 1 while every node runs, else None."""
        return self.nodes[1].pid if self.is_running() else None

    def running_nodes(self) -> list[int]:
        """Ids of the nodes whose process is alive."""
        return [i for i, node in self.nodes.items() if node.is_running()]

    def is_running(self) -> bool:
        """True when every node's process is alive."""
        return len(self.running_nodes()) == len(self.nodes)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, timeout: float = 180.0) -> None:
        """Start every stopped node (in parallel) and wait until metadata shows all brokers."""
        self.start_nodes(list(self.nodes), timeout)

    def start_nodes(self, node_ids: list[int], timeout: float = 180.0) -> None:
        """Start these nodes in parallel (a node alone cannot finish starting while the quorum
        lacks a majority) and wait until metadata lists every running node as a broker."""
        with ThreadPoolExecutor(max_workers=max(1, len(node_ids))) as pool:
            futures = [pool.submit(self.nodes[i].start, timeout) for i in node_ids]
        for future in futures:
            future.result()
        self.wait_brokers(set(self.running_nodes()), timeout)

    def wait_brokers(self, expected: set[int], timeout: float = 120.0) -> None:
        """Wait until cluster metadata lists exactly the brokers ``expected``."""
        _proc.wait_for(
            lambda: self.brokers() == expected,
            timeout,
            f"Kafka cluster metadata to show brokers {sorted(expected)}",
            interval=0.2,
        )

    def stop(self, timeout: float = 60.0) -> None:
        """Graceful shutdown of every node, all at once: one after another, the last node
        would wait in its controlled shutdown for a quorum that left with the others."""
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            futures = [pool.submit(node.stop, timeout) for node in self.nodes.values()]
        for future in futures:
            future.result()

    def destroy(self) -> None:
        """Stop every node and delete the data (and ``base_dir`` if temporary)."""
        for node in self.nodes.values():
            node.kill()
            shutil.rmtree(node.data_dir, ignore_errors=True)
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (its next start recovers its logs)."""
        self.nodes[node_id].kill()

    def stop_node(self, node_id: int, timeout: float = 60.0) -> None:
        """Graceful (controlled) shutdown of one node: its leaderships move first."""
        self.nodes[node_id].stop(timeout)

    def start_node(self, node_id: int, timeout: float = 180.0) -> None:
        """Start one node and wait until it is back in the metadata."""
        self.start_nodes([node_id], timeout)

    # -- who does what -------------------------------------------------------------------------
    def admin(self) -> AdminClient:
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers, "error_cb": _quiet}
        return AdminClient(config)

    def brokers(self) -> set[int]:
        """Broker ids in the cluster metadata (empty when no node answers)."""
        try:
            return set(self.admin().list_topics(timeout=5).brokers)
        except KafkaException:  # no node answers yet
            return set()

    def leader_of(self, topic: str, partition: int) -> int:
        """Leader node of a partition (-1 while it has none)."""
        meta = self.admin().list_topics(topic, timeout=10).topics[topic]
        return int(meta.partitions[partition].leader)

    def partitions(self, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
        """``{partition: (leader, replicas, isr)}`` of ``topic`` ({} if unknown)."""
        meta = self.admin().list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return {}
        return {
            p: (int(m.leader), list(m.replicas), list(m.isrs)) for p, m in meta.partitions.items()
        }

    def fully_replicated(self, topics: list[str] | None = None) -> bool:
        """True when every partition (of ``topics``, or of all topics the metadata lists,
        internal ones included) has a leader and all its replicas in the ISR."""
        try:
            meta = self.admin().list_topics(timeout=10)
        except KafkaException:
            return False
        for name, topic in meta.topics.items():
            if topics is not None and name not in topics:
                continue
            if topic.error is not None:
                return False
            for part in topic.partitions.values():
                if part.leader < 0 or sorted(part.isrs) != sorted(part.replicas):
                    return False
        return True

    def coordinator_of(self, transactional_id: str) -> int:
        """Node id of the transaction coordinator of ``transactional_id`` (FindCoordinator)."""
        return self._coordinator(transactional_id, TRANSACTION)

    def _coordinator(self, key: str, key_type: int) -> int:
        errors = []
        for node_id in self.running_nodes():
            try:
                return find_coordinator("127.0.0.1", self.nodes[node_id].port, key, key_type)
            except (OSError, RuntimeError) as exc:
                errors.append(f"node {node_id}: {exc}")
        raise RuntimeError(f"no coordinator for {key!r}: {'; '.join(errors)}")

    def active_controller(self) -> int | None:
        """The quorum leader as the running nodes last recorded it (their ``quorum-state``
        files: the highest leader epoch wins); None when no running node knows one."""
        best: tuple[int, int] | None = None
        for node_id in self.running_nodes():
            state = self.nodes[node_id].data_dir / "__cluster_metadata-0" / "quorum-state"
            try:
                data: dict[str, Any] = json.loads(state.read_text())
            except (OSError, ValueError):
                continue
            leader, epoch = int(data.get("leaderId", -1)), int(data.get("leaderEpoch", -1))
            if leader > 0 and (best is None or epoch > best[1]):
                best = (leader, epoch)
        if best is None or best[0] not in self.running_nodes():
            return None
        return best[0]


def _quiet(err: Any) -> None:
    """Connection errors to stopped nodes are expected here."""


def _fresh_port(taken: set[int]) -> int:
    while (port := _proc.free_port()) in taken:
        pass
    taken.add(port)
    return port


def find_coordinator(host: str, port: int, key: str, key_type: int, timeout: float = 5.0) -> int:
    """Send FindCoordinator v1 to one broker; return the coordinator's node id.

    Raises ``RuntimeError`` on an error code (e.g. COORDINATOR_NOT_AVAILABLE while the
    coordinator moves) and ``OSError`` when the broker does not answer."""
    client_id, correlation = b"cdc-outbox-sandbox", 0x6B6B
    raw_key = key.encode()
    header = struct.pack(">hhih", 10, 1, correlation, len(client_id)) + client_id
    body = struct.pack(">h", len(raw_key)) + raw_key + struct.pack(">b", key_type)
    request = header + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        reply = _recv_exact(sock, size)
    got, _throttle, error = struct.unpack_from(">iih", reply)
    if got != correlation:
        raise RuntimeError("FindCoordinator: correlation id mismatch")
    if error != 0:
        raise RuntimeError(f"FindCoordinator error code {error}")
    offset = 10
    (msg_len,) = struct.unpack_from(">h", reply, offset)
    offset += 2 + max(msg_len, 0)
    (node_id,) = struct.unpack_from(">i", reply, offset)
    return int(node_id)
