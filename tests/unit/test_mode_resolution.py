"""Mode resolution (issue 35): what the settings alone decide about ``mode`` is decided by the
settings validator, one rule per test (runtime facts such as wal_level stay in the service)."""

from __future__ import annotations

import os

import pytest

from cdc_outbox.config.modes import resolve_mode
from cdc_outbox.config.settings import Settings, load_settings
from cdc_outbox.errors import ConfigError

DSN = "host=db.example dbname=shop"
DEBEZIUM = {"preset": "debezium"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("CDC_OUTBOX_"):
            monkeypatch.delenv(name)


def refused(**overrides: object) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(overrides={"dsn": DSN, **overrides})
    message = str(info.value)
    assert "\n" not in message and message.startswith("config: ")
    return message


def test_polling_mode_without_a_table_with_status_columns_is_refused() -> None:
    message = refused(mode="polling", columns=DEBEZIUM)
    assert message == (
        "config: polling mode needs the status columns of the default column preset"
        " (status, attempts, available_at, ...); public.outbox (the debezium preset) has none:"
        ' use mode = "cdc" or columns.preset = "default"'
    )


def test_polling_mode_with_exactly_once_or_table_less_events_is_refused() -> None:
    assert "polling is at-least-once" in refused(mode="polling", delivery="exactly_once")
    assert "polling never sees table-less events" in refused(mode="polling", message_prefix="app")


def test_auto_mode_with_unmarked_status_rows_is_refused() -> None:
    assert "would publish every row again" in refused(mode="auto", cdc_mark_published="off")


def test_auto_mode_resolves_to_cdc_only_when_polling_cannot_relay_everything() -> None:
    plain = resolve_mode(Settings(dsn=DSN))
    assert (plain.mode, plain.fallback_blocked) == ("auto", None)
    statusless = resolve_mode(Settings(dsn=DSN, columns=DEBEZIUM))  # type: ignore[arg-type]
    assert statusless.mode == "cdc"
    assert statusless.fallback_blocked == (
        "statusless_outbox",
        "public.outbox has no status columns (cannot be polled)",
    )
    table_less = resolve_mode(Settings(dsn=DSN, message_prefix="app"))
    assert table_less.mode == "cdc" and table_less.fallback_blocked is not None
    assert table_less.fallback_blocked[0] == "table_less_events"


@pytest.mark.parametrize("mode", ["cdc", "polling"])
def test_an_explicit_mode_is_kept(mode: str) -> None:
    resolved = resolve_mode(Settings(dsn=DSN, mode=mode))  # type: ignore[arg-type]
    assert (resolved.mode, resolved.fallback_blocked) == (mode, None)


def test_polling_mode_refuses_a_table_it_would_never_relay() -> None:
    """Polling claims only tables with status columns: a statusless table beside them would
    be configured and never relayed, so the mode is refused, naming that table."""
    message = refused(
        mode="polling",
        outboxes=[
            {"schema": "public", "table": "outbox"},
            {"schema": "billing", "table": "events", "columns": DEBEZIUM},
        ],
    )
    assert message == (
        "config: polling mode needs the status columns of the default column preset"
        " (status, attempts, available_at, ...); billing.events (the debezium preset) has none:"
        ' use mode = "cdc" or columns.preset = "default"'
    )
