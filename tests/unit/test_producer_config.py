"""kafka/producer_config.py: how long the relay producer's records may wait for a batch."""

from __future__ import annotations

from cdc_outbox.kafka.producer_config import TRANSACTIONAL_DEFAULTS, linger_s, producer_config


def test_linger_s_reads_linger_ms_of_the_merged_config() -> None:
    merged, _ = producer_config({})
    assert linger_s(merged) == 0.02  # our default
    merged, _ = producer_config({"linger.ms": "0"})
    assert linger_s(merged) == 0.0
    merged, _ = producer_config({}, transactional_id="t")
    assert linger_s(merged) == float(TRANSACTIONAL_DEFAULTS["linger.ms"]) / 1000


def test_linger_s_takes_the_alias_and_librdkafkas_default() -> None:
    assert linger_s({"queue.buffering.max.ms": "7"}) == 0.007
    assert linger_s({}) == 0.005
    assert linger_s({"linger.ms": "soon"}) == 0.005  # librdkafka refuses it at build
