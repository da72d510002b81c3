"""The relay as a real process in tests: its settings as ``CDC_OUTBOX_*`` variables
(:func:`settings_env`) and a ``python -m cdc_outbox run`` child (:class:`RelayProcess`, over
the generic :class:`ChildProcess`), its output kept in test-artifacts/."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr

from cdc_outbox.config.settings import Settings

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes ``python -m cdc_outbox run`` use ``settings``: this
    process's environment without its ``CDC_OUTBOX_*`` variables, plus one ``CDC_OUTBOX_*``
    variable for every setting that differs from its default (nested ones with ``__``,
    ``kafka.config`` as JSON)."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_OUTBOX_")}
    env.update(_changed_settings(settings, None, "CDC_OUTBOX_"))
    return env


def _changed_settings(model: BaseModel, defaults: BaseModel | None, prefix: str) -> dict[str, str]:
    """``{variable: value}`` for the fields of ``model`` that differ from ``defaults`` (or,
    when ``None``, from the fields' declared defaults), recursing into nested tables."""
    out: dict[str, str] = {}
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        if defaults is None:
            default = info.get_default(call_default_factory=True)
        else:
            default = getattr(defaults, name)
        var = prefix + name.upper()
        if isinstance(value, BaseModel):
            out.update(_changed_settings(value, default, var + "__"))
        elif value != default:
            out[var] = _env_text(value)
    return out


def _env_text(value: Any) -> str:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, list):  # [[outboxes]]
        return json.dumps([v.model_dump(mode="json", by_alias=True) for v in value])
    if value is None:
        return ""  # the only optional setting, columns.headers: "" means "no headers column"
    return str(value)


class ChildProcess:
    """``python -m cdc_outbox <args>`` as a real child process, its output in
    ``test-artifacts/<name>.log`` (for kill -9 and SIGTERM)."""

    def __init__(self, name: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.log_path = ARTIFACTS / f"{name}.log"
        self.log_path.write_bytes(b"")  # this process's log only, not an earlier run's
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self, args: list[str], env: dict[str, str]) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cdc_outbox", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop_quietly(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


class RelayProcess(ChildProcess):
    """``python -m cdc_outbox run`` with ``settings`` (as environment variables)."""

    def __init__(self, settings: Settings, name: str, **extra_env: str) -> None:
        super().__init__(name)
        self.settings = settings
        self.extra_env = extra_env

    def start(self) -> None:
        self._spawn(["run"], {**settings_env(self.settings), **self.extra_env})

    def terminate(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)
