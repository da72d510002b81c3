"""The relay subprocess gets exactly the test's settings (no services needed)."""

from __future__ import annotations

import os

import pytest

from cdc_outbox.config.settings import Settings, load_settings
from tests.support.relay import relay_settings
from tests.support.relay_process import settings_env

DSN = "host=db.example user=app password=pw dbname=shop"


def _clear_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("CDC_OUTBOX_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings are built from the test's values only (they would read CDC_OUTBOX_* too)."""
    _clear_env(monkeypatch)


def _load_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings ``python -m cdc_outbox run`` would load from ``env``."""
    _clear_env(monkeypatch)
    for name, value in env.items():
        if name.startswith("CDC_OUTBOX_"):
            monkeypatch.setenv(name, value)
    return load_settings()


def test_settings_env_passes_every_non_default_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = relay_settings(
        DSN,
        "kafka-1:9092",
        "t1",
        max_in_flight=5_000,
        null_payload="tombstone",
        cdc_mark_published="off",
        log_format="json",
        columns={"preset": "debezium", "event_type": "kind"},
        kafka={"bootstrap_servers": "kafka-1:9092", "config": {"linger.ms": 5, "acks": "all"}},
        polling={"batch_size": 7, "lease_s": 1.5},
    )
    monkeypatch.setenv("CDC_OUTBOX_POLLING__MAX_ATTEMPTS", "3")  # the parent's: not inherited
    env = settings_env(settings)
    assert env["CDC_OUTBOX_MAX_IN_FLIGHT"] == "5000"
    assert env["CDC_OUTBOX_MODE"] == "cdc"  # relay_settings' default
    assert env["CDC_OUTBOX_METRICS_PORT"] == "0"
    assert env["CDC_OUTBOX_KAFKA__CONFIG"] == '{"linger.ms": "5", "acks": "all"}'
    assert env["CDC_OUTBOX_COLUMNS__HEADERS"] == ""  # debezium: no headers column
    assert "CDC_OUTBOX_POLLING__MAX_ATTEMPTS" not in env  # a default: left out
    assert _load_from(env, monkeypatch) == settings


def test_settings_env_keeps_an_explicit_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    auto = relay_settings(DSN, "k:9092", "t2", mode="auto", metrics_port=9999)
    env = settings_env(auto)
    assert "CDC_OUTBOX_MODE" not in env  # auto is the default
    assert env["CDC_OUTBOX_METRICS_PORT"] == "9999"
    loaded = _load_from(env, monkeypatch)
    assert loaded == auto and loaded.mode == "auto"
