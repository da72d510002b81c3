#!/usr/bin/env bash
# Set up everything cdc-outbox needs, from nothing, on Debian 12 (idempotent; re-runs are fast).
#   - PostgreSQL server binaries, Java 17+ and Maven, Chromium and promtool for the
#     monitoring tests, redis-server for the consumer example, Go for the Kubernetes manifest validator (apt-get, only what is
#     missing)
#   - a C compiler and the Python headers, for the relay's mypyc-compiled decode (setup.py)
#   - .venv with the package and its dev tools (pip install -e '.[dev]', redone when
#     pyproject.toml, setup.py or the compiled module changes), and a .pth file that makes
#     the dev harness cdc_outbox_dev (not part of the wheel) importable from this checkout
#   - the PostgreSQL 16, 17 and 18 server builds (io.zonky.test.postgres on Maven Central, for
#     CDC_OUTBOX_PG_VERSION), the Kafka broker jars and its class-data-sharing archive, the Apicurio schema registry
#     (3.3.3 when a Java >= 21 is installed, else 2.6.13.Final), and the Go modules of
#     docker/k8s/validate (from the Go module proxy), cached in
#     ${CDC_OUTBOX_CACHE_DIR:-~/.cache/cdc-outbox}
# Runs as root, or as a user with sudo for apt-get. PYTHON selects the interpreter (>= 3.11).
# Debian's postgresql package also starts a cluster on port 5432: harmless, cdc-outbox's
# sandbox runs its own servers on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'bootstrap: %s\n' "$*" >&2; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PYTHON="${PYTHON:-python3}"

java_major() {
  local v
  v=$(java -XshowSettings:properties -version 2>&1 |
    sed -n 's/^ *java.specification.version = \([0-9]*\).*/\1/p')
  echo "${v:-0}"
}

python_ok() {
  command -v "$PYTHON" >/dev/null 2>&1 &&
    "$PYTHON" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
}

packages=()
compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || packages+=(postgresql)
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ] 2>/dev/null; then
  packages+=(openjdk-17-jre-headless)
fi
command -v mvn >/dev/null 2>&1 || packages+=(maven)
# The dashboard test drives a real headless Chromium; promtool validates the alert rules.
command -v chromium >/dev/null 2>&1 || packages+=(chromium fonts-dejavu-core)
command -v promtool >/dev/null 2>&1 || packages+=(prometheus)
# docker/k8s/validate (go.mod: go 1.19, so Debian 12's golang-go suffices).
command -v go >/dev/null 2>&1 || packages+=(golang-go)
# The consumer tests and the cache-invalidation example run a real Redis.
command -v redis-server >/dev/null 2>&1 || packages+=(redis-server)
python_ok || packages+=(python3 python3-venv)
# setup.py compiles cdc_outbox/pgwire/insert_row.py with mypyc (pure Python without these).
command -v gcc >/dev/null 2>&1 || packages+=(gcc libc6-dev)
python_ok && ! "$PYTHON" -c 'import os, sysconfig, sys
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  2>/dev/null && packages+=(python3-dev)

if [ "${#packages[@]}" -gt 0 ]; then
  log "installing ${packages[*]}"
  $SUDO apt-get update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${packages[@]}"
fi
python_ok || { log "$PYTHON >= 3.11 with venv is required"; exit 1; }

if ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  log "creating .venv with $PYTHON"
  rm -rf .venv
  "$PYTHON" -m venv .venv
fi
# Reinstalled when the package's build inputs change: pyproject.toml, setup.py and the modules
# setup.py compiles with mypyc (its COMPILED_MODULES; each extension sits next to its source and
# a stale one would shadow edits).
compiled=$(grep -o '"cdc_outbox/[^"]*\.py"' setup.py | tr -d '"')
# shellcheck disable=SC2086  # the module paths have no spaces
stamp=".venv/.installed-$(cat pyproject.toml setup.py $compiled | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  log "installing cdc-outbox and dev tools into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# cdc_outbox_dev (sandbox, workload, demo) is not installed: put this checkout on the path.
pth="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/cdc_outbox_dev.pth"
if [ "$(cat "$pth" 2>/dev/null)" != "$PWD" ]; then
  log "adding $PWD to the .venv import path (cdc_outbox_dev)"
  printf '%s\n' "$PWD" >"$pth"
fi

log "checking the Kafka broker cache"
.venv/bin/python -c '
import logging
logging.basicConfig(level=logging.INFO, format="bootstrap: %(message)s")
from cdc_outbox_dev.sandbox.kafka import ensure_cds_archive, ensure_kafka_jars
ensure_kafka_jars()
ensure_cds_archive()
'
log "checking the PostgreSQL 16, 17 and 18 server builds (Maven Central) cache"
.venv/bin/python -c '
import logging
logging.basicConfig(level=logging.INFO, format="bootstrap: %(message)s")
from cdc_outbox_dev.sandbox.pg_versions import ensure_all
ensure_all()
'
log "checking the schema registry (Apicurio) cache"
.venv/bin/python -c '
import logging
logging.basicConfig(level=logging.INFO, format="bootstrap: %(message)s")
from cdc_outbox_dev.sandbox.registry import ensure_registry_dist
ensure_registry_dist()
'
log "checking the Go modules of the Kubernetes manifest validator"
cache="${CDC_OUTBOX_CACHE_DIR:-$HOME/.cache/cdc-outbox}"
(cd docker/k8s/validate &&
  GOFLAGS=-mod=mod GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOTOOLCHAIN=local \
    go mod download)
log "ready"
