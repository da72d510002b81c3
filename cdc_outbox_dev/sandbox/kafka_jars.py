"""The Kafka broker's jars from Maven Central, fetched once into a per-user cache.

``ensure_kafka_jars()`` writes a small pom and runs ``mvn dependency:copy-dependencies`` into
``$CDC_OUTBOX_CACHE_DIR/kafka-<version>/jars`` (default ``~/.cache/cdc-outbox``). A marker file is
written only after success, and a file lock keeps concurrent processes from downloading twice;
``maven_fetch()`` does this for any Maven artifact (the schema registry uses it too).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"

# Kafka 4.1 logs through slf4j 1.7: the binding is log4j-slf4j-impl (log4j-slf4j2-impl is the
# slf4j 2.x binding and leaves the broker silently on the NOP logger).
_POM = f"""\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>cdc_outbox</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{LOG4J_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{LOG4J_VERSION}</version></dependency>
  </dependencies>
</project>
"""


def cache_root() -> Path:
    """``$CDC_OUTBOX_CACHE_DIR`` or ``~/.cache/cdc-outbox``."""
    env = os.environ.get("CDC_OUTBOX_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "cdc-outbox"


def kafka_home() -> Path:
    """Cache directory of this Kafka version (jars, pom, CDS archive, lock)."""
    return cache_root() / f"kafka-{KAFKA_VERSION}"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock on ``path`` (flock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def maven_fetch(
    home: Path,
    name: str,
    what: str,
    goal: list[str],
    artifact: str,
    *,
    pom: str | None = None,
    extract: bool = False,
) -> Path:
    """Return ``home/name``, filled once by ``mvn -q -B <goal> -DoutputDirectory=...``.

    Runs under ``home/<name>.lock`` into a staging directory that must then hold ``artifact``
    (a ``.tar.gz`` is unpacked and removed if ``extract``); ``pom`` is written to
    ``home/pom.xml`` and passed with ``-f``. ``home/<name>.complete`` marks success."""
    target, marker = home / name, home / f"{name}.complete"
    if marker.exists():
        return target
    with locked(home / f"{name}.lock"):
        if marker.exists():
            return target
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError(f"Apache Maven ('mvn') is needed once to fetch {what}")
        began = time.monotonic()
        staging = home / f"{name}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        args = [mvn, "-q", "-B"]
        if pom is not None:
            pom_path = home / "pom.xml"
            pom_path.write_text(pom)
            args += ["-f", str(pom_path)]
        logger.info("fetching %s with Maven into %s", what, target)
        out = subprocess.run(
            [*args, *goal, f"-DoutputDirectory={staging}"],
            capture_output=True,
            text=True,
            check=False,
        )
        fetched = staging / artifact
        if out.returncode != 0 or not fetched.exists():
            shutil.rmtree(staging, ignore_errors=True)
            raise RuntimeError(
                f"mvn failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
            )
        if extract:
            subprocess.run(["tar", "-xzf", str(fetched), "-C", str(staging)], check=True)
            fetched.unlink()
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        marker.write_text(f"{what}\n")
        logger.info("%s ready in %.1fs", what, time.monotonic() - began)
    return target


def ensure_kafka_jars() -> Path:
    """Return the directory of the broker's runtime jars, downloading them once with ``mvn``."""
    return maven_fetch(
        kafka_home(),
        "jars",
        f"the Kafka {KAFKA_VERSION} jars (log4j {LOG4J_VERSION})",
        ["dependency:copy-dependencies", "-DincludeScope=runtime"],
        f"kafka_2.13-{KAFKA_VERSION}.jar",
        pom=_POM,
    )
