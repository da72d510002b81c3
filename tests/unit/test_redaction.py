"""Secret Kafka keys: one rule for settings display, log scrubbing and the producer's log."""

from __future__ import annotations

import pytest

from cdc_outbox.config_models import KafkaSettings
from cdc_outbox.kafka.producer_config import redact_config
from cdc_outbox.redaction import MASK, is_secret_kafka_key

SECRET_KEYS = [
    "sasl.password",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.keystore.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.config",
    "sasl.jaas.config",
    "sasl.oauthbearer.token.endpoint.url",
    "SASL.PASSWORD",  # keys are matched case-insensitively
]
PLAIN_KEYS = ["sasl.username", "sasl.mechanism", "security.protocol", "linger.ms", "acks"]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_keys_are_masked_by_settings_and_producer_alike(key: str) -> None:
    assert is_secret_kafka_key(key)
    assert redact_config({key: "s3cr3t"}) == {key: MASK}
    assert KafkaSettings(config={key: "s3cr3t"}).redacted_config() == {key: MASK}


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_plain_keys_are_shown(key: str) -> None:
    assert not is_secret_kafka_key(key)
    assert redact_config({key: "v"}) == {key: "v"}
    assert KafkaSettings(config={key: "v"}).redacted_config() == {key: "v"}


def test_producer_and_settings_redaction_agree_on_a_whole_config() -> None:
    config = {k: f"value-{i}" for i, k in enumerate(SECRET_KEYS + PLAIN_KEYS)}
    producer_view = redact_config(config)
    assert producer_view == KafkaSettings(config=config).redacted_config()
    assert {k for k, v in producer_view.items() if v == MASK} == set(SECRET_KEYS)
