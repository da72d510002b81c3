"""docker/Dockerfile, parsed with dockerfile-parse (no Docker engine needed): a multi-stage
build whose final stage installs only the wheels, runs as a non-root user, starts a real
console script of the package, stops on SIGTERM and checks /healthz. The HEALTHCHECK command
itself is run against a real metrics endpoint. :func:`problems` is also fed broken copies, so
the rules are shown to catch what they are meant to."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser
from prometheus_client import CollectorRegistry

from cdc_outbox.config.monitoring import health_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.monitoring.health import HealthChecks
from cdc_outbox.monitoring.http_server import MonitoringServer
from cdc_outbox.telemetry.relay_stats import RelayStats

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: What must never run in the final stage: compilers, build tools, building wheels.
BUILD_TOOLS = ("gcc", "g++", "build-essential", "make ", "pip wheel", "python -m build", "-dev")

Instruction = dict[str, Any]


def parse(text: str) -> tuple[DockerfileParser, list[list[Instruction]]]:
    """The parser and the instructions of each stage (comments left out)."""
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))
    stages: list[list[Instruction]] = []
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            stages.append([])
        if stages and instruction["instruction"] != "COMMENT":
            stages[-1].append(instruction)
    return parser, stages


def values(stage: list[Instruction], name: str) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == name]


def exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list), value
    return [str(part) for part in parsed]


def healthcheck_command(stage: list[Instruction]) -> list[str]:
    (value,) = values(stage, "HEALTHCHECK")
    flags, _, command = value.partition(" CMD ")
    assert all(flag.startswith("--") for flag in flags.split()), flags
    return exec_form(command.strip())


def problems(text: str) -> list[str]:
    """Every rule the image breaks (empty: fine)."""
    parser, stages = parse(text)
    found: list[str] = []
    if len(stages) < 2:
        return ["not multi-stage"]
    builder, final = stages[0], stages[-1]
    if " AS " not in builder[0]["value"].upper():
        found.append("builder stage has no name")
    if not any("pip wheel" in v or "-m build" in v for v in values(builder, "RUN")):
        found.append("builder builds no wheel")
    if parser.baseimage != "python:3.11-slim":
        found.append(f"final base image {parser.baseimage}")
    final_runs = " ".join(values(final, "RUN"))
    if not any("from=builder" in v for v in values(final, "RUN") + values(final, "COPY")):
        found.append("final stage takes nothing from the builder")
    if "--no-index" not in final_runs:
        found.append("final stage may download packages")
    found += [f"build tool {t!r} in final stage" for t in BUILD_TOOLS if t in final_runs]
    if any(not v.startswith("--from=") for v in values(final, "COPY") + values(final, "ADD")):
        found.append("final stage copies from the build context")
    users = values(final, "USER")
    user = users[-1].split(":")[0] if users else "root"
    if user in ("root", "0") or not user.isdigit():
        found.append(f"final stage runs as {user!r} (needs a numeric non-root uid)")
    entrypoint = exec_form(values(final, "ENTRYPOINT")[-1]) if values(final, "ENTRYPOINT") else []
    if entrypoint[:1] != ["cdc-outbox"] or len(entrypoint) != 1:
        found.append(f"entrypoint {entrypoint}")
    if values(final, "CMD")[-1:] != ['["run"]']:
        found.append('CMD is not ["run"]')
    if values(final, "STOPSIGNAL") != ["SIGTERM"]:
        found.append("no STOPSIGNAL SIGTERM")
    health = values(final, "HEALTHCHECK")
    if not health or "/healthz" not in health[0] or "curl" in health[0]:
        found.append("no python HEALTHCHECK of /healthz")
    envs = parser.envs
    if envs.get("CDC_OUTBOX_METRICS_HOST") != "0.0.0.0":
        found.append("metrics endpoint not reachable from outside the container")
    if values(final, "EXPOSE") != [envs.get("CDC_OUTBOX_METRICS_PORT", "9077")]:
        found.append("EXPOSE is not the metrics port")
    labels = parser.labels
    for key in ("title", "description", "version", "licenses"):
        if not labels.get(f"org.opencontainers.image.{key}"):
            found.append(f"no OCI label {key}")
    return found


def test_the_dockerfile_follows_every_rule() -> None:
    assert problems(DOCKERFILE.read_text()) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("USER 10001:10001", "USER root"), "final stage runs as 'root'"),
        (("USER 10001:10001", "USER cdc-outbox"), "final stage runs as 'cdc-outbox'"),
        (("USER 10001:10001\n", ""), "final stage runs as 'root'"),
        (("python -m pip install", "apt-get install -y gcc && python -m pip install"),
         "build tool 'gcc' in final stage"),
        (("--no-index ", ""), "final stage may download packages"),
        (("STOPSIGNAL SIGTERM", "STOPSIGNAL SIGKILL"), "no STOPSIGNAL SIGTERM"),
        (('ENTRYPOINT ["cdc-outbox"]', 'ENTRYPOINT ["python"]'), "entrypoint ['python']"),
        (("EXPOSE 9077", "EXPOSE 8080"), "EXPOSE is not the metrics port"),
        (("FROM ${PYTHON_IMAGE}\nARG PYTHON_IMAGE\n", "FROM python:3.12\nARG PYTHON_IMAGE\n"),
         "final base image python:3.12"),
        (("ARG VERSION=0.1.0\n", "ARG VERSION\n"), "no OCI label version"),
    ],
)  # fmt: skip
def test_a_broken_dockerfile_is_caught(change: tuple[str, str], expected: str) -> None:
    text = DOCKERFILE.read_text()
    assert change[0] in text
    found = problems(text.replace(change[0], change[1], 1))
    assert any(expected in problem for problem in found), found


def test_entrypoint_and_labels_match_the_package() -> None:
    parser, stages = parse(DOCKERFILE.read_text())
    (script,) = exec_form(values(stages[-1], "ENTRYPOINT")[-1])
    target = PYPROJECT["project"]["scripts"][script]  # a console script of the wheel
    (installed,) = metadata.entry_points(group="console_scripts", name=script)
    assert installed.value == target and callable(installed.load())
    from typer.main import get_command

    from cdc_outbox.cli import app

    commands = get_command(app).commands  # type: ignore[attr-defined]
    assert exec_form(values(stages[-1], "CMD")[-1])[0] in commands
    assert parser.labels["org.opencontainers.image.version"] == PYPROJECT["project"]["version"]
    assert parser.labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]


def test_builder_gets_what_the_wheel_is_built_from() -> None:
    _, stages = parse(DOCKERFILE.read_text())
    sources = [s for v in values(stages[0], "COPY") for s in v.split()[:-1]]
    needed = {"pyproject.toml", "setup.py", PYPROJECT["project"]["readme"], "cdc_outbox"}
    assert needed <= set(sources)
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") :].count("*") == 1  # everything out, then back in:
    for source in needed:
        assert (ROOT / source).exists() and f"!{source}" in {i.rstrip("/") for i in ignore}


def test_the_healthcheck_command_asks_healthz() -> None:
    _, stages = parse(DOCKERFILE.read_text())
    command = healthcheck_command(stages[-1])
    assert command[0] == "python"
    stats = RelayStats()
    settings = Settings.model_validate({"dsn": "host=127.0.0.1", "metrics_port": 0})
    health = HealthChecks(health_section(settings), lambda: stats)
    server = MonitoringServer("127.0.0.1", 0, CollectorRegistry(), None, health)
    server.start()
    try:

        def run() -> int:
            env = {"CDC_OUTBOX_METRICS_PORT": str(server.port), "PATH": "/usr/bin:/bin"}
            argv = [sys.executable, *command[1:]]
            return subprocess.run(argv, env=env, capture_output=True, timeout=30).returncode

        stats.beat()
        assert run() == 0
        stats.last_loop_unix -= settings.health.loop_stale_s + 1  # the loop is stuck
        assert run() == 1
    finally:
        server.close()
