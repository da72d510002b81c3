"""Checkpoint records and the relay's own topics (issue 23: forged or malformed checkpoints,
rows routed onto relay topics)."""

from __future__ import annotations

import json

import pytest

from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import ConfigError
from cdc_outbox.kafka.checkpoints import Checkpoint, _decoded, read_last
from cdc_outbox.mapping.build import outbox_mapper
from cdc_outbox.mapping.rows import DEFAULT_COLUMNS, OutboxMapper
from cdc_outbox.records import DeadLetter, OutboxRecord

OURS = Checkpoint("slot", "7", "db", 1234, ["a"], timeline=2, producer="cdc-outbox.7.db.slot")


def _valid(cp: Checkpoint) -> bool:
    return cp.written_by("slot", "7", "db", "cdc-outbox.7.db.slot")


def test_a_checkpoint_round_trips_with_its_history_and_producer() -> None:
    back = Checkpoint.decode(OURS.encode())
    assert back == OURS
    assert _valid(back)


def test_a_catch_up_checkpoint_round_trips_with_its_dead_letters() -> None:
    batch = Checkpoint("slot", "7", "db", 0, ["a"], dead_letters=[("b", "blocked_by c")])
    assert Checkpoint.decode(batch.encode()) == batch


def test_an_older_checkpoint_without_timeline_or_producer_still_decodes() -> None:
    old = json.dumps({"slot": "slot", "system_id": "7", "database": "db", "end_lsn": 5}).encode()
    back = Checkpoint.decode(old)
    assert (back.timeline, back.producer, back.end_lsn) == (None, None, 5)
    assert back.dead_letters == []
    assert _valid(back)  # the key and the fields decide for an older record


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"slot": "slot"}',
        b'{"slot": "slot", "system_id": "7", "database": "db", "end_lsn": "99999999"}',
        b'{"slot": "slot", "system_id": "7", "database": "db", "end_lsn": -1}',
        b'{"slot": "slot", "system_id": "7", "database": "db", "end_lsn": 1, "timeline": 0}',
        b'{"slot": "slot", "system_id": "7", "database": "db", "end_lsn": 1, "catch_up_ids": "x"}',
        b'{"slot": "slot", "system_id": "7", "database": "db", "end_lsn": 1, "dead_letters": [1]}',
    ],
)
def test_a_malformed_record_under_our_key_is_ignored_with_an_error(
    value: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    assert _decoded(value, "cps", 17, _valid) is None
    assert "ignoring a malformed record in checkpoint topic cps at offset 17" in caplog.text


@pytest.mark.parametrize(
    "forged",
    [
        Checkpoint("slot", "7", "db", 10**12, producer="someone-else"),
        Checkpoint("other-slot", "7", "db", 10**12, producer="cdc-outbox.7.db.slot"),
        Checkpoint("slot", "8", "db", 10**12, producer="cdc-outbox.7.db.slot"),
    ],
)
def test_a_checkpoint_not_written_by_this_relay_is_never_trusted(
    forged: Checkpoint, caplog: pytest.LogCaptureFixture
) -> None:
    assert _decoded(forged.encode(), "cps", 3, _valid) is None
    assert "not written by this relay" in caplog.text


def _settings(**overrides: object) -> Settings:
    return Settings.model_validate({"dsn": "postgresql://u@127.0.0.1/db", **overrides})


def _map(mapper: OutboxMapper, aggregate_type: str) -> OutboxRecord | DeadLetter:
    return mapper.map_row(["e1", aggregate_type, "k", "Created", "{}", "{}"])


def test_a_row_routed_onto_a_relay_topic_is_a_dead_letter() -> None:
    settings = _settings(
        topic_template="{aggregate_type}",
        eos={"checkpoint_topic": "relay.checkpoints"},
        dead_letter_topic="relay.dead",
    )
    mapper = outbox_mapper(settings)
    for topic in ("relay.checkpoints", "relay.dead"):
        result = _map(mapper, topic)
        assert isinstance(result, DeadLetter), topic
        assert f"topic {topic!r} is reserved for the relay's own records" in result.reason
    assert isinstance(_map(mapper, "orders"), OutboxRecord)


def test_a_constant_template_naming_a_relay_topic_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="names a topic of the relay's own"):
        OutboxMapper("public", "outbox", DEFAULT_COLUMNS, "cps", reserved_topics=frozenset({"cps"}))


def test_a_kafka_error_while_reading_the_checkpoint_is_a_connection_error() -> None:
    """The relay retries a ConnectionError (a new session); a KafkaException escaped it and
    ended the process (NOT_LEADER_FOR_PARTITION just after a broker restart, chaos seed
    291265). Here: nothing listens on the port, so the metadata request fails."""
    with pytest.raises(ConnectionError, match="reading checkpoint topic cps failed"):
        read_last({"bootstrap.servers": "127.0.0.1:1"}, "cps", b"k", timeout=1.0)
