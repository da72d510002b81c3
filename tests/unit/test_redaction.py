"""Secret Kafka keys: one rule for settings display, log scrubbing and the producer's log."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from cdc_outbox import redaction
from cdc_outbox.config.models import KafkaSettings
from cdc_outbox.config.settings import Settings
from cdc_outbox.monitoring.lag import one_line
from cdc_outbox.redaction import MASK, is_secret_kafka_key, redact, redact_kafka_config
from cdc_outbox.store.db_pool import _MaskSecrets

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
    assert redact_kafka_config({key: "s3cr3t"}) == {key: MASK}
    assert KafkaSettings(config={key: "s3cr3t"}).redacted_config() == {key: MASK}


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_plain_keys_are_shown(key: str) -> None:
    assert not is_secret_kafka_key(key)
    assert redact_kafka_config({key: "v"}) == {key: "v"}
    assert KafkaSettings(config={key: "v"}).redacted_config() == {key: "v"}


def test_producer_and_settings_redaction_agree_on_a_whole_config() -> None:
    config = {k: f"value-{i}" for i, k in enumerate(SECRET_KEYS + PLAIN_KEYS)}
    producer_view = redact_kafka_config(config)
    assert producer_view == KafkaSettings(config=config).redacted_config()
    assert {k for k, v in producer_view.items() if v == MASK} == set(SECRET_KEYS)


# --- one ``redact`` for every error line and log record ---------------------------------------

# Secrets never contain the mask's character: a secret that is a piece of ``***`` cannot be hidden.
_SECRET = st.text(alphabet=st.characters(blacklist_characters="*"), min_size=1, max_size=8)


@given(
    secrets=st.lists(_SECRET, max_size=5),
    pieces=st.lists(st.one_of(_SECRET, st.sampled_from(["", " ", ":", "x"])), max_size=12),
    data=st.data(),
)
def test_redact_leaves_no_secret_and_no_secret_containing_another(
    secrets: list[str], pieces: list[str], data: st.DataObject
) -> None:
    # Text made of secrets interleaved with fragments and filler; a longer secret that contains a
    # shorter one must be masked whole, not left as the shorter one's mask with its rest showing.
    chosen = [data.draw(st.sampled_from(secrets)) for _ in pieces] if secrets else []
    text = "".join(p + c for p, c in zip(pieces, chosen, strict=False)) or "".join(pieces)
    out = redact(text, secrets)
    for secret in secrets:
        assert secret not in out
    for secret in secrets:
        assert redact(secret, secrets) == MASK


def test_redact_masks_the_longer_secret_whole_whatever_the_order() -> None:
    assert redact("login xs3cretx failed", ["s3cret", "xs3cretx"]) == "login *** failed"
    assert redact("login xs3cretx failed", ["xs3cretx", "s3cret"]) == "login *** failed"
    assert redact("nothing here", []) == "nothing here"
    assert redact("a", [""]) == "a"


def _nested_secret_settings() -> Settings:
    # The dsn password comes first in secret_values(); the Kafka password contains it.
    return Settings(
        dsn=SecretStr("host=db.example dbname=shop password=s3cret"),
        kafka=KafkaSettings(config={"sasl.password": "xs3cretx"}),
    )


def test_error_lines_mask_a_secret_that_contains_another_whole() -> None:
    settings = _nested_secret_settings()
    assert one_line(RuntimeError("auth xs3cretx rejected"), settings) == "auth *** rejected"


def test_log_filter_masks_a_secret_that_contains_another_whole() -> None:
    settings = _nested_secret_settings()
    mask = _MaskSecrets()
    mask.secrets.update(settings.secret_values())
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "auth %s", ("xs3cretx",), None)
    assert mask.filter(record)
    assert record.getMessage() == "auth ***"


def test_no_hand_written_masking_outside_redact() -> None:
    """Issue 35: one ``redact`` (strings) and one ``redact_kafka_config`` (a librdkafka config)
    in redaction.py; no module masks secrets with its own loop, comprehension or replace."""
    package = Path(redaction.__file__).parent
    replace = re.compile(r"\.replace\([^()]*(\([^()]*\))?[^()]*,\s*MASK\)")  # (secret, MASK)
    comprehension = re.compile(r"MASK if is_secret_kafka_key")  # redact_kafka_config's body
    offenders = [
        f"{path.relative_to(package)}:{n}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if replace.search(line) or (comprehension.search(line) and path.name != "redaction.py")
    ]
    assert not offenders, offenders
