"""Exactly-once with an outbox table without status columns (the Debezium layout, issue 36):
allowed with ``cdc_mark_published = "delete"``, whose catch-up deletes each Kafka
transaction's rows once it commits (the last committed batch's rows are deleted before the
next snapshot: a redo never sees them), exactly as the status layout's marks them; refused
with ``"off"``, whose rows stay and would be published again by every catch-up."""

from __future__ import annotations

import pytest

from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import ConfigError
from tests.support.settings import config_error

DEBEZIUM = {"schema": "shipping", "table": "events", "columns": {"preset": "debezium"}}


def _settings(marking: str | None, **extra: object) -> Settings:
    entry = dict(DEBEZIUM) if marking is None else {**DEBEZIUM, "cdc_mark_published": marking}
    return Settings.model_validate(
        {
            "dsn": "host=db",
            "mode": "cdc",
            "delivery": "exactly_once",
            "message_prefix": "app",
            "outboxes": [{"table": "outbox"}, entry],
            **extra,
        }
    )


def test_exactly_once_takes_a_statusless_outbox_that_deletes_published_rows() -> None:
    s = _settings("delete")
    assert s.delivery == "exactly_once"
    assert [o.cdc_mark_published for o in s.outbox_settings()] == ["update", "delete"]
    assert s.on_permanent_error == "halt"  # no status column: nothing to park or redrive


@pytest.mark.parametrize("marking", ["off", None])
def test_exactly_once_refuses_a_statusless_outbox_that_keeps_its_rows(marking: str | None) -> None:
    with pytest.raises(ValueError, match=r'shipping\.events.*cdc_mark_published = "delete"'):
        _settings(marking)


def test_the_single_table_keys_follow_the_same_rule() -> None:
    eos = {"dsn": "host=db", "mode": "cdc", "delivery": "exactly_once"}
    debezium = {**eos, "columns": {"preset": "debezium"}}
    assert "status columns" in config_error(overrides=debezium)
    single = Settings.model_validate({**debezium, "cdc_mark_published": "delete"})
    assert single.outbox().cdc_mark_published == "delete"
    with pytest.raises(ConfigError):
        raise ConfigError(config_error(overrides={**debezium, "cdc_mark_published": "off"}))
