"""A local single-node Apache Kafka (KRaft, combined broker+controller) from Maven Central jars.

``ensure_kafka_jars()`` fetches the broker jars once with ``mvn`` into
``$CDC_OUTBOX_CACHE_DIR/kafka-4.1.1/jars`` (default ``~/.cache/cdc-outbox``) and, once, records a
JVM class-data-sharing archive (AppCDS) by starting and stopping a throw-away broker: later brokers
start about a second faster. ``CDC_OUTBOX_KAFKA_CDS=0`` disables the archive.

``LocalKafka`` binds PLAINTEXT and CONTROLLER listeners to 127.0.0.1 free ports. Defaults (any can
be overridden with ``broker_settings``): ``num.partitions=3`` for auto-created topics (so per-key
ordering is actually exercised), replication factor 1 and one partition for internal topics,
``group.initial.rebalance.delay.ms=0``, ``auto.create.topics.enable=true``. Readiness is a Kafka
ApiVersions round trip on the PLAINTEXT port: the broker enables request processing only after
it is registered and unfenced, so a broker that answers also accepts produce requests.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from importlib import resources
from pathlib import Path

from cdc_outbox_dev.sandbox import _proc
from cdc_outbox_dev.sandbox._lifecycle import LocalServer
from cdc_outbox_dev.sandbox.kafka_jars import (
    KAFKA_VERSION,
    cache_root,
    ensure_kafka_jars,
    kafka_home,
    locked,
)

__all__ = [
    "KAFKA_VERSION",
    "LocalKafka",
    "api_versions_ok",
    "cache_root",
    "ensure_cds_archive",
    "ensure_kafka_jars",
    "new_cluster_id",
]

logger = logging.getLogger(__name__)

DEFAULT_BROKER_SETTINGS: dict[str, str] = {
    "num.partitions": "3",
    "auto.create.topics.enable": "true",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "min.insync.replicas": "1",
    # After a SIGKILL the restarted node must wait out its previous incarnation's session
    # (DUPLICATE_BROKER_REGISTRATION): 3 s instead of 9 s makes start-after-kill ~4 s, not ~11 s.
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    # The default 128 MB cleaner buffer costs ~0.5 s of start-up; compacted topics here are tiny.
    "log.cleaner.dedupe.buffer.size": "2097152",
    "num.network.threads": "2",
    "num.io.threads": "4",
    "num.recovery.threads.per.data.dir": "1",
}

JVM_OPTS = [
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-Djava.awt.headless=true",
]


def ensure_cds_archive() -> Path | None:
    """Return the AppCDS archive for the broker, recording it once (None if disabled/failed)."""
    if os.environ.get("CDC_OUTBOX_KAFKA_CDS", "1") == "0":
        return None
    jars = ensure_kafka_jars()
    home = kafka_home()
    # An archive is only valid for one JVM build and one set of jars: key it by both.
    java = Path(_java_binary()).resolve()
    marker = jars.parent / "jars.complete"
    ident = f"{java}:{java.stat().st_mtime_ns}:{marker.stat().st_mtime_ns}"
    key = hashlib.sha1(ident.encode()).hexdigest()[:12]
    archive, failed = home / f"kafka-{key}.jsa", home / f"kafka-{key}.jsa.failed"
    if archive.exists() or failed.exists():
        return archive if archive.exists() else None
    with locked(home / "cds.lock"):
        if archive.exists() or failed.exists():
            return archive if archive.exists() else None
        began = time.monotonic()
        staging = home / f"kafka.jsa.tmp-{os.getpid()}"
        staging.unlink(missing_ok=True)
        logger.info("recording a class-data-sharing archive for faster Kafka start-up")
        try:
            with LocalKafka(cds=False, _dump_archive=staging):
                pass
        except (RuntimeError, TimeoutError, OSError) as exc:
            logger.warning("CDS archive not recorded (%s); Kafka starts without it", exc)
        if staging.exists() and staging.stat().st_size > 0:
            staging.rename(archive)
            for stale in home.glob("kafka-*.jsa*"):  # archives of older JVMs or jars
                if stale != archive:
                    stale.unlink(missing_ok=True)
            logger.info("CDS archive %s recorded in %.1fs", archive, time.monotonic() - began)
            return archive
        staging.unlink(missing_ok=True)
        failed.write_text("recording the CDS archive failed; delete this file to retry\n")
        return None


def new_cluster_id() -> str:
    """A KRaft cluster id: 22 characters of URL-safe base64 of a random UUID."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _java_binary() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` from PATH."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is None:
        raise RuntimeError("Java (17+) is needed to run the Kafka broker")
    return java


def api_versions_ok(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when a Kafka broker at ``host:port`` answers an ApiVersions v0 request without error."""
    client_id = b"cdc-outbox-sandbox"
    correlation = 0x5A5A
    header = struct.pack(">hhih", 18, 0, correlation, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(header)) + header)
            (size,) = struct.unpack(">i", _recv_exact(sock, 4))
            body = _recv_exact(sock, size)
    except OSError:
        return False
    if len(body) < 6:
        return False
    got_correlation, error_code = struct.unpack_from(">ih", body)
    return bool(got_correlation == correlation and error_code == 0)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        chunks += chunk
    return bytes(chunks)


class LocalKafka(LocalServer):
    """A local KRaft broker; ``with LocalKafka() as kafka:`` starts it and cleans up.

    ``base_dir=None`` uses a temporary directory that ``close()`` deletes; an explicit ``base_dir``
    keeps data and ports, so a later instance re-attaches to a broker running there.
    ``node_id``, ``quorum_voters`` (``id@host:port,...``; default: this node alone) and
    ``cluster_id`` (used when storage is formatted; default: a new one) make it one node of a
    cluster (``kafka_cluster.LocalKafkaCluster``).
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        port: int | None = None,
        broker_settings: dict[str, str] | None = None,
        controller_port: int | None = None,
        *,
        node_id: int = 1,
        quorum_voters: str | None = None,
        cluster_id: str | None = None,
        cds: bool = True,
        _dump_archive: Path | None = None,
    ) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = (
            Path(tempfile.mkdtemp(prefix="cdc-outbox-kafka-")) if base_dir is None else base_dir
        ).absolute()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.properties = self.base_dir / "server.properties"
        self.data_dir = self.base_dir / "data"
        self.log_dir = self.base_dir / "logs"
        self.broker_settings = {**DEFAULT_BROKER_SETTINGS, **(broker_settings or {})}
        saved_port, saved_controller = self._persisted_ports()
        self.port = port or saved_port or _proc.free_port()
        self.controller_port = controller_port or saved_controller or _proc.free_port()
        while self.controller_port == self.port:
            self.controller_port = _proc.free_port()
        self.node_id = node_id
        self.quorum_voters = quorum_voters
        self.cluster_id = cluster_id
        self._cds = cds
        self._dump_archive = _dump_archive
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:PORT`` of the PLAINTEXT listener."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """Pid of the broker JVM when running, else None."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid  # our own child: no pid-file or /proc guesswork
        try:
            pid = int((self.base_dir / "kafka.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        # Started by another process (sandbox up): make sure the pid was not reused.
        alive = _proc.pid_alive(pid) and str(self.properties) in _proc.cmdline(pid)
        return pid if alive else None

    def is_running(self) -> bool:
        """True when the broker process of this directory is alive (not necessarily ready)."""
        return self.pid is not None

    def start(self, timeout: float = 120.0) -> None:
        """Start the broker (formatting storage on first use) and wait until it is ready.

        A no-op apart from ``wait_ready`` when it is already running.
        """
        if self.is_running():
            self.wait_ready(timeout)
            return
        began = time.monotonic()
        jars = ensure_kafka_jars()
        archive = ensure_cds_archive() if self._cds else None
        self._write_config()
        java = self._java_cmd(jars, archive)
        if not (self.data_dir / "meta.properties").exists():
            self._format(java)
        for port in (self.port, self.controller_port):
            _proc.wait_port_free(port)
        extra = [f"-XX:ArchiveClassesAtExit={self._dump_archive}"] if self._dump_archive else []
        with open(self.log_dir / "kafka.out", "ab") as out:
            self._proc = subprocess.Popen(
                [*java[:1], *extra, *java[1:], "kafka.Kafka", str(self.properties)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                start_new_session=True,
            )
        (self.base_dir / "kafka.pid").write_text(f"{self._proc.pid}\n")
        try:
            self.wait_ready(timeout)
        except (TimeoutError, RuntimeError):
            self.kill()
            raise
        logger.info(
            "Kafka ready on %s (pid %d) in %.2fs",
            self.bootstrap_servers,
            self._proc.pid,
            time.monotonic() - began,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the broker answers Kafka requests; raise if its process exits first."""

        def ready() -> bool:
            if self.pid is None:
                code = self._proc.returncode if self._proc is not None else None
                raise RuntimeError(
                    f"Kafka broker is not running (exit status {code}); log tail:\n"
                    + _proc.tail(self.log_dir / "server.log")
                    + "\n"
                    + _proc.tail(self.log_dir / "kafka.out")
                )
            return api_versions_ok("127.0.0.1", self.port)

        _proc.wait_for(ready, timeout, f"Kafka on {self.bootstrap_servers}")

    def stop(self, timeout: float = 60.0) -> None:
        """Graceful shutdown (SIGTERM), data kept; SIGKILL after ``timeout``."""
        pid = self.pid
        if pid is None:
            return
        _proc.terminate(pid, signal.SIGTERM, timeout, self._own(pid))
        logger.info("Kafka on %s stopped", self.bootstrap_servers)

    def kill(self) -> None:
        """SIGKILL the broker (no clean shutdown; the next start recovers its logs)."""
        pid = self.pid
        if pid is None:
            return
        _proc.kill_group(pid, self._own(pid))
        logger.info("Kafka on %s killed (SIGKILL)", self.bootstrap_servers)

    def restart(self) -> None:
        """Stop gracefully and start again on the same ports with the same data."""
        self.stop()
        self.start()

    def destroy(self) -> None:
        """Stop the broker and delete its data (and ``base_dir`` if temporary)."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # -- internals ----------------------------------------------------------------------------
    def _own(self, pid: int) -> subprocess.Popen[bytes] | None:
        return self._proc if self._proc is not None and self._proc.pid == pid else None

    def _persisted_ports(self) -> tuple[int | None, int | None]:
        try:
            text = self.properties.read_text()
        except OSError:
            return None, None
        plain = re.search(r"PLAINTEXT://127\.0\.0\.1:(\d+)", text)
        ctrl = re.search(r"CONTROLLER://127\.0\.0\.1:(\d+)", text)
        return (int(plain.group(1)) if plain else None, int(ctrl.group(1)) if ctrl else None)

    def _write_config(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        managed = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.quorum_voters
            or f"{self.node_id}@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
        }
        lines = ["# written by cdc_outbox_dev.sandbox.kafka at every start"]
        lines += [f"{k}={v}" for k, v in {**self.broker_settings, **managed}.items()]
        self.properties.write_text("\n".join(lines) + "\n")
        log4j = resources.files("cdc_outbox_dev.sandbox").joinpath("log4j2.properties").read_text()
        (self.base_dir / "log4j2.properties").write_text(log4j)

    def _java_cmd(self, jars: Path, archive: Path | None) -> list[str]:
        java = _java_binary()
        cds = [f"-XX:SharedArchiveFile={archive}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
        return [
            java,
            *JVM_OPTS,
            *(cds if archive else []),
            f"-Dlog4j2.configurationFile={self.base_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.log_dir}",
            "-cp",
            f"{jars}/*",
        ]

    def _format(self, java: list[str]) -> None:
        cluster_id = self.cluster_id or new_cluster_id()
        out = subprocess.run(
            [
                *java,
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id}",  # ids may start with "-"
                "-c",
                str(self.properties),
                "--ignore-formatted",
            ],
            capture_output=True,
            text=True,
            check=False,
            cwd=self.base_dir,
        )
        if out.returncode != 0:
            raise RuntimeError(f"Kafka storage format failed:\n{out.stdout}\n{out.stderr}")
        logger.info("formatted Kafka storage %s (cluster %s)", self.data_dir, cluster_id)
