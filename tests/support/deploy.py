"""Helpers for the tests of the deployment files in docker/ (Dockerfile, Compose, Kubernetes):
where they are, and loading an environment block the way the relay would in its container."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dockerfile_parse import DockerfileParser

from cdc_outbox.config.settings import ENV_PREFIX, Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
#: A DSN for variables whose real value comes from a secret the test cannot see.
DUMMY_DSN = "host=db.invalid dbname=dummy user=dummy"


def image_env() -> dict[str, str]:
    """The ``ENV`` of docker/Dockerfile's final stage (what every relay container starts with)."""
    text = (DOCKER / "Dockerfile").read_text()
    return dict(DockerfileParser(fileobj=io.BytesIO(text.encode())).envs)


@contextmanager
def only_env(env: Mapping[str, str]) -> Iterator[None]:
    """This process's environment without any ``CDC_OUTBOX_*`` variable, plus ``env``."""
    saved = dict(os.environ)
    try:
        for name in [n for n in os.environ if n.upper().startswith(ENV_PREFIX)]:
            del os.environ[name]
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def settings_of(env: Mapping[str, str]) -> Settings:
    """Settings the relay builds from ``env`` (raises ConfigError for unknown or invalid
    variables, as ``cdc-outbox`` would at start)."""
    with only_env(env):
        return load_settings()


def relay_env(service: Mapping[str, Any]) -> dict[str, str]:
    """A Compose service's ``environment`` (mapping or list form) as a dict."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}
