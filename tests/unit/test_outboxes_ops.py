"""Several outbox tables ([[outboxes]]) in the operator paths that need no server: auto mode's
fallback rule, the batch shares of the polling relay."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_outbox.config.modes import polling_fallback_blocked
from cdc_outbox.config.settings import Settings
from cdc_outbox.polling.rows import batch_shares
from tests.support.helpers import lead_through_failing_streams

DEFAULT = {"schema": "public", "table": "outbox"}
DEBEZIUM = {"schema": "cdc", "table": "raw", "columns": {"preset": "debezium"},
            "cdc_mark_published": "delete"}  # fmt: skip


def _settings(*entries: dict[str, Any], **values: Any) -> Settings:
    return Settings.model_validate(
        {"dsn": "postgresql://u@h/db", "mode": "auto", "outboxes": list(entries), **values}
    )


def test_auto_mode_falls_back_only_when_every_table_can_be_polled() -> None:
    assert polling_fallback_blocked(_settings(DEFAULT, {**DEFAULT, "schema": "b"})) is None
    reason, message = polling_fallback_blocked(_settings(DEFAULT, DEBEZIUM)) or ("", "")
    assert reason == "statusless_outbox"
    assert message == "cdc.raw has no status columns (cannot be polled)"
    table_less = polling_fallback_blocked(_settings(DEFAULT, message_prefix="app"))
    assert table_less is not None and table_less[0] == "table_less_events"


def test_a_statusless_table_anywhere_keeps_auto_mode_on_cdc(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first table has status columns, the second has none: polling would never relay
    the second one's rows, so a failing stream is retried, never replaced by polling."""
    with caplog.at_level("WARNING", logger="cdc_outbox.service.relay_service"):
        fell_back, attempts = lead_through_failing_streams(
            _settings(DEFAULT, DEBEZIUM), monkeypatch
        )
    assert fell_back == []
    assert attempts == 3
    assert "cdc.raw has no status columns (cannot be polled); relaying by CDC only" in caplog.text


@pytest.mark.parametrize(
    ("batch", "tables", "shares"),
    [(100, 1, [100]), (100, 3, [34, 33, 33]), (2, 3, [1, 1, 1]), (10, 2, [5, 5])],
)
def test_each_table_gets_its_share_of_the_batch(batch: int, tables: int, shares: list[int]) -> None:
    assert batch_shares(batch, tables) == shares


def test_schemas_check_finds_each_outbox_topic_of_a_record() -> None:
    from cdc_outbox.avro.check import _topics
    from cdc_outbox.errors import ConfigError

    billing = {**DEFAULT, "topic_template": "billing.{event_type}"}
    shipping = {"schema": "s", "table": "t", "topic_template": "shipping.{event_type}"}
    settings = _settings(billing, shipping, {**billing, "schema": "b2"})
    assert _topics(settings, "shop.Paid", {}) == ["billing.Paid", "shipping.Paid"]
    assert _topics(settings, "shop.Paid", {"Paid": "t"}) == ["t"]
    with pytest.raises(ConfigError, match=r"needs the topic of shop\.Paid"):
        _topics(_settings(billing, DEBEZIUM), "shop.Paid", {})


def test_ddl_covers_every_outbox_table() -> None:
    from cdc_outbox.store import schema

    settings = _settings(DEFAULT, {**DEBEZIUM, "cdc_mark_published": "delete"}, mode="cdc")
    text = lambda stmts: ";\n".join(s.as_string(None) for s in stmts)  # noqa: E731
    assert schema.publication_ddl(settings).as_string(None) == (
        'CREATE PUBLICATION "cdc_outbox_pub" FOR TABLE "public"."outbox", "cdc"."raw"'
        " WITH (publish = 'insert', publish_via_partition_root = true)"
    )
    roles = text(schema.role_ddl(settings, "relay"))
    assert 'GRANT USAGE ON SCHEMA "public" TO "relay"' in roles
    assert 'GRANT USAGE ON SCHEMA "cdc" TO "relay"' in roles
    assert 'GRANT SELECT ON "cdc"."raw" TO "relay"' in roles
    assert 'GRANT UPDATE ("status"' in roles and 'ON "public"."outbox" TO "relay"' in roles
    assert (
        'GRANT UPDATE ("status", "attempts", "available_at", "locked_at", "locked_by",'
        ' "published_at", "last_error") ON "cdc"."raw"' not in roles
    )  # no status columns
    assert 'GRANT DELETE ON "cdc"."raw" TO "relay"' in roles
    assert '"public"."cdc_outbox_relay_state"' in roles  # the first outbox's schema
    raw = text(schema.outbox_table_ddl(settings, settings.outbox("cdc.raw")))
    assert raw.startswith('CREATE TABLE IF NOT EXISTS "cdc"."raw"') and "status" not in raw
