"""The one failure classification (cdc_outbox.errors) and the env spelling of dotted keys."""

from __future__ import annotations

import pytest

from cdc_outbox.config.settings import load_settings
from cdc_outbox.config.sources import effective_settings
from cdc_outbox.errors import (
    AuthenticationFailed,
    CdcOutboxError,
    ConfigError,
    DatabaseUnavailable,
    FailureClass,
    PrivilegeMissing,
    SchemaMissing,
    TopicMissing,
    cannot_heal,
    classify,
)


class _SqlError(Exception):
    """Stands in for a psycopg error: what the classification reads (sqlstate, text)."""

    def __init__(self, text: str, sqlstate: str | None) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (_SqlError('relation "public.nosuch" does not exist', "42P01"), SchemaMissing),
        (_SqlError('column "status" does not exist', "42703"), SchemaMissing),
        (_SqlError("permission denied for table outbox", "42501"), PrivilegeMissing),
        (
            DatabaseUnavailable('FATAL: password authentication failed for user "app"'),
            AuthenticationFailed,
        ),
        (DatabaseUnavailable('FATAL: role "ghost" does not exist'), AuthenticationFailed),
        (DatabaseUnavailable('FATAL: database "nodb" does not exist'), SchemaMissing),
        (ConfigError("config: bad"), ConfigError),
        (TopicMissing("topic x"), TopicMissing),
    ],
)
def test_what_cannot_heal_halts_with_its_exit_code(exc: Exception, kind: type) -> None:
    assert classify(exc).kind is FailureClass.HALT
    error = cannot_heal(exc)
    assert isinstance(error, kind)
    assert "\n" not in str(error)


@pytest.mark.parametrize(
    "exc",
    [
        DatabaseUnavailable("connection refused: is the server running?"),
        DatabaseUnavailable("FATAL: the database system is starting up"),
        _SqlError("terminating connection due to administrator command", "57P01"),
        _SqlError('role "x" does not exist', "42704"),  # a statement's error, not a login
        CdcOutboxError("replication connection lost"),
        OSError("network unreachable"),
    ],
)
def test_transient_failures_are_retried(exc: Exception) -> None:
    assert classify(exc).kind is FailureClass.RETRY
    assert cannot_heal(exc) is None


def test_exit_codes_are_distinct_per_class() -> None:
    codes = [c.exit_code for c in (ConfigError, SchemaMissing, PrivilegeMissing,
                                   AuthenticationFailed, TopicMissing)]  # fmt: skip
    assert codes == [2, 4, 5, 6, 7]


def test_double_underscore_spells_a_dot_in_kafka_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_OUTBOX_DSN", "host=h")
    monkeypatch.setenv("CDC_OUTBOX_KAFKA__CONFIG__SASL__PASSWORD", "pw")
    monkeypatch.setenv("CDC_OUTBOX_KAFKA__CONFIG__LINGER.MS", "7")  # the old spelling
    settings = load_settings()
    assert settings.kafka.config == {"sasl.password": "pw", "linger.ms": "7"}
    assert "pw" in settings.secret_values()


def test_config_sources_follow_the_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_OUTBOX_DSN", "host=h")
    monkeypatch.setenv("CDC_OUTBOX_POLLING", '{"batch_size": 3}')
    settings = load_settings(overrides={"slot_name": "s_flag"})
    rows = effective_settings(
        settings,
        file_data={"slot_name": "s_file", "polling": {"lease_s": 4}},
        environ={"CDC_OUTBOX_DSN": "host=h", "CDC_OUTBOX_POLLING": '{"batch_size": 3}'},
        flags={"slot_name": "s_flag"},
    )
    assert rows["slot_name"] == ("s_flag", "flag")
    assert rows["polling.batch_size"] == (3, "env")
    assert rows["polling.lease_s"][1] == "file"  # the file named it (this load did not read it)
    assert rows["dsn"][1] == "env" and rows["mode"] == ("auto", "default")
