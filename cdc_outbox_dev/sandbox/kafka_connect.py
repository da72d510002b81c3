"""Kafka Connect (standalone) with the Debezium PostgreSQL connector, from Maven Central.

Fetched once, the way the broker and the registry are (:func:`kafka_jars.maven_fetch`), into
``$CDC_OUTBOX_CACHE_DIR`` (default ``~/.cache/cdc-outbox``):

- ``kafka-connect-<KAFKA_VERSION>/jars``: ``org.apache.kafka:connect-runtime`` and
  ``connect-json`` of the sandbox broker's version, with log4j 2 (the worker's classpath);
- ``debezium-<DEBEZIUM_VERSION>/plugin``: Debezium's own connector distribution
  ``io.debezium:debezium-connector-postgres:<version>:tar.gz:plugin`` (the connector, its
  driver and ``debezium-connect-plugins``, which holds the outbox ``EventRouter`` SMT), the
  worker's ``plugin.path`` (an isolated class loader, as in a production install).

:class:`LocalConnect` runs ``ConnectStandalone WORKER.properties CONNECTOR.properties`` as a
plain process in its own session, its REST listener on a free 127.0.0.1 port; ``start`` returns
once the REST API reports the connector's task RUNNING. The properties are the caller's.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path

from cdc_outbox_dev.sandbox import _proc
from cdc_outbox_dev.sandbox._lifecycle import LocalServer
from cdc_outbox_dev.sandbox.kafka_jars import KAFKA_VERSION, LOG4J_VERSION, cache_root, maven_fetch

__all__ = ["DEBEZIUM_VERSION", "LocalConnect", "connect_java", "ensure_connect"]

logger = logging.getLogger(__name__)

#: The newest Debezium whose modules Maven Central serves whole here (3.x: Java 17+).
DEBEZIUM_VERSION = "3.6.1.Final"
#: What Kafka's ``connect-standalone.sh`` and ``kafka-run-class.sh`` start the worker with.
JVM_OPTS = [
    "-Xms256m",
    "-Xmx2g",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]

_POM = f"""\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>cdc_outbox</groupId><artifactId>kafka-connect-runtime</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId>
      <version>{KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-json</artifactId>
      <version>{KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{LOG4J_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{LOG4J_VERSION}</version></dependency>
  </dependencies>
</project>
"""


def ensure_connect() -> tuple[Path, Path]:
    """``(worker jars directory, plugin.path directory)``, each downloaded once with ``mvn``."""
    jars = maven_fetch(
        cache_root() / f"kafka-connect-{KAFKA_VERSION}",
        "jars",
        f"the Kafka Connect {KAFKA_VERSION} runtime jars",
        ["dependency:copy-dependencies", "-DincludeScope=runtime"],
        f"connect-runtime-{KAFKA_VERSION}.jar",
        pom=_POM,
    )
    plugin = maven_fetch(
        cache_root() / f"debezium-{DEBEZIUM_VERSION}",
        "plugin",
        f"the Debezium {DEBEZIUM_VERSION} PostgreSQL connector",
        [
            "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy",
            f"-Dartifact=io.debezium:debezium-connector-postgres:{DEBEZIUM_VERSION}:tar.gz:plugin",
        ],
        f"debezium-connector-postgres-{DEBEZIUM_VERSION}-plugin.tar.gz",
        extract=True,
    )
    return jars, plugin


def connect_java() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` from PATH (Debezium 3.x needs 17+)."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is None:
        raise RuntimeError("Java (17+) is needed to run Kafka Connect")
    return java


class LocalConnect(LocalServer):
    """One standalone Connect worker running one connector.

    ``worker`` and ``connector`` are the two properties files' contents; ``worker`` must set
    ``listeners`` to :attr:`rest_url` (:meth:`rest_port` is free) and may use ``{plugin_path}``
    and ``{offsets}``, filled in here. ``base_dir=None``: a temporary directory, deleted on
    close."""

    def __init__(
        self, worker: str, connector: str, name: str, base_dir: Path | None = None
    ) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="cdc-outbox-connect-"))
        self.worker, self.connector, self.name = worker, connector, name
        self.rest_port = _proc.free_port()
        self.log_path = self.base_dir / "server.log"  # log4j2.properties: WARN and up
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def pid(self) -> int | None:
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    def _task_state(self) -> str:
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(
                f"Kafka Connect exited ({self._proc.returncode}):\n{_proc.tail(self.log_path)}"
            )
        try:
            url = f"{self.rest_url}/connectors/{self.name}/status"
            with urllib.request.urlopen(url, timeout=2) as resp:
                status = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return ""
        tasks = status.get("tasks") or [{}]
        state = str(tasks[0].get("state", ""))
        if state == "FAILED":
            raise RuntimeError(f"the connector's task failed: {tasks[0].get('trace', '')[:4000]}")
        return state

    def start(self, timeout: float = 180.0) -> None:
        """Start the worker and wait until the connector's task is RUNNING."""
        jars, plugin = ensure_connect()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        worker = self.base_dir / "worker.properties"
        worker.write_text(
            self.worker.format(plugin_path=plugin, offsets=self.base_dir / "offsets.dat")
        )
        connector = self.base_dir / "connector.properties"
        connector.write_text(self.connector)
        log4j = resources.files("cdc_outbox_dev.sandbox").joinpath("log4j2.properties").read_text()
        (self.base_dir / "log4j2.properties").write_text(log4j)
        args = [
            connect_java(),
            *JVM_OPTS,
            f"-Dlog4j2.configurationFile={self.base_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.base_dir}",
            "-cp",
            f"{jars}/*",
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(worker),
            str(connector),
        ]
        with open(self.base_dir / "connect.out", "ab") as out:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                start_new_session=True,
            )
        try:
            _proc.wait_for(
                lambda: self._task_state() == "RUNNING", timeout, "the connector", interval=0.1
            )
        except BaseException:
            self.stop(10)
            raise
        logger.info("Kafka Connect (pid %d) runs %s", self._proc.pid, self.name)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (the worker stops its connector), SIGKILL after ``timeout``."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            _proc.terminate(proc.pid, signal.SIGTERM, timeout, proc)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)
