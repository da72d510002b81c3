"""A local Apicurio Registry (Confluent-compatible API) from Maven Central, no Docker.

``ensure_registry_dist()`` fetches ``io.apicurio:apicurio-registry-app:<version>:tar.gz:all`` once
with ``mvn dependency:copy`` and unpacks it under ``$CDC_OUTBOX_CACHE_DIR/apicurio-<version>``
(default ``~/.cache/cdc-outbox``). Version 3.3.3 needs Java >= 21: it is used when such a JDK is
found (``/usr/lib/jvm/*``, ``$JAVA_HOME`` or ``java`` on the path), else 2.6.13.Final on Java 17.

``LocalRegistry`` binds HTTP (and, in 3.x, the management port) to 127.0.0.1 and sets BACKWARD
global compatibility. Storage is in-memory (every start is empty; ids start at 1), unless
``durable=True`` on 3.x: then an H2 file under ``base_dir`` keeps subjects and ids across
``stop()``/``start()``, like a production registry (``durable`` tells which one you got).
``stop()`` then ``start()`` reuses the same port, so a client's URL stays valid across an outage.
``url`` is the Confluent API base (``.../apis/ccompat/v7``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from cdc_outbox_dev.sandbox import _proc
from cdc_outbox_dev.sandbox._lifecycle import LocalServer
from cdc_outbox_dev.sandbox.kafka_jars import cache_root, maven_fetch

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

__all__ = ["LocalRegistry", "ensure_registry_dist", "registry_client", "registry_java"]

logger = logging.getLogger(__name__)

V3, V2 = "3.3.3", "2.6.13.Final"
_JVM = ["-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]


#: Seconds a request of :func:`registry_client` waits for an answer before the client retries it.
CLIENT_TIMEOUT_S = 10


def registry_client(url: str) -> SchemaRegistryClient:
    """A confluent-kafka registry client for ``url`` (the tests' and the demo's own, not the
    relay's). With a timeout: once, right after a restart of the registry, a request got no
    answer and, without one, waited until the test's 600 s timeout (CI, 2026-12-04); timed
    out, the client retries it (``max.retries``, default 3)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url, "timeout": CLIENT_TIMEOUT_S})


def _java_major(java: str) -> int:
    try:
        out = subprocess.run(
            [java, "-XshowSettings:properties", "-version"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    m = re.search(r"java\.specification\.version = (\d+)", out.stderr)
    return int(m.group(1)) if m else 0


def registry_java() -> tuple[str, str]:
    """``(java binary, Apicurio version)``: 3.3.3 on a Java >= 21 if any, else 2.6.13.Final
    (``CDC_OUTBOX_SANDBOX_REGISTRY_VERSION=2`` forces 2.6.13.Final on ``java`` of the path)."""
    on_path = shutil.which("java")
    if os.environ.get("CDC_OUTBOX_SANDBOX_REGISTRY_VERSION", "").startswith("2") and on_path:
        return on_path, V2
    candidates: list[str] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    candidates += sorted(str(p) for p in Path("/usr/lib/jvm").glob("*/bin/java"))
    for java in candidates:
        if Path(java).exists() and _java_major(java) >= 21:
            return java, V3
    if on_path is None:
        raise RuntimeError("Java 17+ is needed to run the schema registry")
    return on_path, V2


def ensure_registry_dist(version: str | None = None) -> Path:
    """Return the unpacked Apicurio distribution of ``version`` (default: what the JDK runs),
    downloading it once with ``mvn``."""
    version = version or registry_java()[1]
    return maven_fetch(
        cache_root() / f"apicurio-{version}",
        "dist",
        f"Apicurio Registry {version}",
        [
            "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy",
            f"-Dartifact=io.apicurio:apicurio-registry-app:{version}:tar.gz:all",
        ],
        f"apicurio-registry-app-{version}-all.tar.gz",
        extract=True,
    )


def _runner(dist: Path) -> Path:
    quarkus = next(dist.rglob("quarkus-run.jar"), None)
    if quarkus is not None:
        return quarkus
    runner = next(dist.rglob("apicurio-registry-app-*-runner.jar"), None)
    if runner is None:
        raise RuntimeError(f"no runnable jar in the Apicurio distribution {dist}")
    return runner


class LocalRegistry(LocalServer):
    """One Apicurio Registry process; ``url`` is the Confluent-compatible API base."""

    def __init__(
        self, base_dir: Path | None = None, port: int | None = None, *, durable: bool = False
    ) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="cdc-outbox-registry-"))
        self._state = self.base_dir / "registry.json"
        saved = json.loads(self._state.read_text()) if self._state.exists() else {}
        self.port = port or saved.get("port") or _proc.free_port()
        self.mgmt_port = saved.get("mgmt_port") or _proc.free_port()
        self.java, self.version = registry_java()
        self.log_path = self.base_dir / "registry.log"
        self.durable = durable and self.version == V3
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    @property
    def pid(self) -> int | None:
        """The registry's pid if it runs (also one started by another process, e.g.
        ``cdc-outbox sandbox up``: recorded in ``base_dir/registry.json``)."""
        if self._proc is not None:
            return self._proc.pid if self._proc.poll() is None else None
        if not self._state.exists():
            return None
        pid = json.loads(self._state.read_text()).get("pid")
        if pid and _proc.pid_alive(pid) and "apicurio" in _proc.cmdline(pid):
            return int(pid)
        return None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def _ready_url(self) -> str:
        port = self.mgmt_port if self.version == V3 else self.port
        return f"http://127.0.0.1:{port}/health/ready"

    def _ready(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(
                f"the registry exited ({self._proc.returncode}):\n{_proc.tail(self.log_path)}"
            )
        try:
            with urllib.request.urlopen(self._ready_url(), timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start(self, timeout: float = 120.0) -> None:
        """Start (empty, BACKWARD) and wait until ready; the port is kept across restarts."""
        if self.running:
            return
        dist = ensure_registry_dist(self.version)
        jar = _runner(dist)
        _proc.wait_port_free(self.port)
        rule = "apicurio" if self.version == V3 else "registry"
        args = [
            self.java,
            *_JVM,
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.http.port={self.port}",
            f"-D{rule}.rules.global.compatibility=BACKWARD",
        ]
        if self.version == V3:
            args += [
                "-Dquarkus.management.host=127.0.0.1",
                f"-Dquarkus.management.port={self.mgmt_port}",
            ]
        if self.durable:
            args.append(f"-Dapicurio.datasource.url=jdbc:h2:file:{self.base_dir / 'h2' / 'db'}")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [*args, "-jar", str(jar)],
                cwd=jar.parent,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._state.write_text(
            json.dumps({"port": self.port, "mgmt_port": self.mgmt_port, "pid": self._proc.pid})
        )
        _proc.wait_for(self._ready, timeout, "the schema registry to be ready", interval=0.2)
        if self.version == V2:  # 2.x enforces the rule but reports NONE: make it explicit
            self._put_config({"compatibility": "BACKWARD"})
        logger.info("schema registry %s ready at %s", self.version, self.url)

    def _put_config(self, body: dict[str, str]) -> None:
        req = urllib.request.Request(
            f"{self.url}/config",
            data=json.dumps(body).encode(),
            method="PUT",
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        with urllib.request.urlopen(req, timeout=10):
            pass

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the process (its in-memory content is lost); ``start`` brings it back empty."""
        pid, proc, self._proc = self.pid, self._proc, None
        if pid is not None:
            _proc.terminate(pid, signal.SIGTERM, timeout, proc)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)
