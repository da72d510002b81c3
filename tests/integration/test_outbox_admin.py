"""``redrive`` and ``cleanup`` against a real PostgreSQL: the functions and the real CLI."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from cdc_outbox.admin import outbox_ops as outbox_admin
from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import ConfigError
from cdc_outbox.store.schema import outbox_table_ddl
from tests.support.helpers import run_cli

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _settings(dsn: str, **values: Any) -> Settings:
    return Settings.model_validate({"dsn": dsn, **values})


def _seed(dsn: str) -> dict[str, str]:
    """Rows in every status; FAILED ones at T0 + 0..3 h with two event types."""
    settings = _settings(dsn)
    rows = [
        ("f0", "FAILED", "OrderPlaced", T0, None),
        ("f1", "FAILED", "OrderPaid", T0 + timedelta(hours=1), None),
        ("f2", "FAILED", "OrderPlaced", T0 + timedelta(hours=2), None),
        ("f3", "FAILED", "OrderPlaced", T0 + timedelta(hours=3), None),
        ("p", "PENDING", "OrderPlaced", T0, None),
        ("w", "PROCESSING", "OrderPlaced", T0, None),
        ("old", "PUBLISHED", "OrderPlaced", T0, datetime.now(UTC) - timedelta(days=10)),
        ("new", "PUBLISHED", "OrderPlaced", T0, datetime.now(UTC) - timedelta(minutes=5)),
    ]
    ids: dict[str, str] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in outbox_table_ddl(settings):
            conn.execute(stmt)
        for name, status, event_type, created, published in rows:
            row = conn.execute(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status,"
                " attempts, created_at, published_at, last_error)"
                " VALUES ('order', %s, %s, '{}', %s, %s, %s, %s, %s) RETURNING id::text",
                (
                    name,
                    event_type,
                    status,
                    10 if status == "FAILED" else 0,
                    created,
                    published,
                    "boom" if status == "FAILED" else None,
                ),
            ).fetchone()
            assert row is not None
            ids[name] = row[0]
    return ids


def _by_agg(dsn: str) -> dict[str, tuple[str, int, str | None]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT aggregate_id, status, attempts, last_error FROM outbox")
        return {r[0]: (r[1], r[2], r[3]) for r in rows}


def test_redrive_filters_count_and_dry_run(pg_dsn: str) -> None:
    ids = _seed(pg_dsn)
    settings = _settings(pg_dsn)
    Filter = outbox_admin.RedriveFilter
    with pytest.raises(ConfigError, match="needs --id"):
        Filter()
    # Dry runs count and change nothing.
    assert outbox_admin.redrive(settings, Filter(everything=True), dry_run=True) == 4
    assert outbox_admin.redrive(settings, Filter(event_type="OrderPaid"), dry_run=True) == 1
    window = Filter(since=T0 + timedelta(hours=1), until=T0 + timedelta(hours=3))
    assert outbox_admin.redrive(settings, window, dry_run=True) == 2
    assert [r.aggregate_id for r in outbox_admin.failed_rows(settings, window)] == ["f1", "f2"]
    assert _by_agg(pg_dsn)["f1"][0] == "FAILED"
    # By id (upper-case form accepted); non-FAILED ids are never touched.
    flt = Filter(ids=(ids["f0"].upper(), ids["p"], ids["old"]))
    assert outbox_admin.redrive(settings, flt) == 1
    assert _by_agg(pg_dsn)["f0"] == ("PENDING", 0, "boom")  # the last error stays on record
    assert _by_agg(pg_dsn)["old"][0] == "PUBLISHED"
    # Type AND time range, oldest first with a limit.
    both = Filter(event_type="OrderPlaced", since=T0 + timedelta(hours=1), limit=1)
    assert outbox_admin.redrive(settings, both) == 1
    states = _by_agg(pg_dsn)
    assert (states["f1"][0], states["f2"][0], states["f3"][0]) == ("FAILED", "PENDING", "FAILED")
    assert outbox_admin.redrive(settings, Filter(everything=True)) == 2
    assert outbox_admin.redrive(settings, Filter(everything=True)) == 0
    assert {s for s, _, _ in _by_agg(pg_dsn).values()} == {"PENDING", "PROCESSING", "PUBLISHED"}


def test_cleanup_deletes_only_old_published_rows_in_batches(pg_dsn: str) -> None:
    _seed(pg_dsn)
    settings = _settings(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status,"
            " published_at) SELECT 'order', 'bulk', 'E', '{}', 'PUBLISHED', now() - interval '8d'"
            " FROM generate_series(1, 25)"
        )
    week = outbox_admin.parse_duration("7d")
    assert outbox_admin.cleanup(settings, week, dry_run=True) == 26
    assert outbox_admin.cleanup(settings, week, batch_size=7) == 26
    assert outbox_admin.cleanup(settings, week, batch_size=7) == 0
    assert sorted(_by_agg(pg_dsn)) == ["f0", "f1", "f2", "f3", "new", "p", "w"]
    assert outbox_admin.cleanup(settings, outbox_admin.parse_duration("1m")) == 1
    assert "new" not in _by_agg(pg_dsn)


def test_debezium_preset_is_refused(pg_dsn: str) -> None:
    settings = _settings(pg_dsn, columns={"preset": "debezium"})
    with pytest.raises(ConfigError, match="debezium preset has none"):
        outbox_admin.redrive(settings, outbox_admin.RedriveFilter(everything=True))
    with pytest.raises(ConfigError, match="debezium preset has none"):
        outbox_admin.cleanup(settings, timedelta(days=1))


def _cli(dsn: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, dsn=dsn, **env)


def test_cli_redrive_and_cleanup(pg_dsn: str) -> None:
    ids = _seed(pg_dsn)
    out = _cli(pg_dsn, "redrive", "--event-type", "OrderPlaced", "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["count"] == 3 and report["dry_run"] is True
    assert [r["aggregate_id"] for r in report["sample"]] == ["f0", "f2", "f3"]
    assert report["sample"][0]["last_error"] == "boom"

    out = _cli(pg_dsn, "redrive", "--id", ids["f1"], "--id", ids["f3"])
    assert out.returncode == 0, out.stderr
    assert "redrove 2 FAILED rows" in out.stdout
    out = _cli(pg_dsn, "redrive", "--since", "2026-01-01T01:30:00", "--until", "2026-01-01T03:00")
    assert "redrove 1 FAILED rows" in out.stdout  # f2 (naive times are UTC)
    assert {a for a, (s, _, _) in _by_agg(pg_dsn).items() if s == "FAILED"} == {"f0"}

    out = _cli(pg_dsn, "redrive")
    assert out.returncode == 2 and "needs --id" in out.stderr
    out = _cli(pg_dsn, "redrive", "--since", "yesterday")
    assert out.returncode == 2 and "invalid time" in out.stderr

    out = _cli(pg_dsn, "cleanup", "--older-than", "7d", "--dry-run")
    assert out.returncode == 0 and "1 published rows would be deleted" in out.stdout
    out = _cli(pg_dsn, "cleanup", "--older-than", "7d", "--batch-size", "1", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["count"] == 1
    out = _cli(pg_dsn, "cleanup", "--older-than", "seven days")
    assert out.returncode == 2 and "invalid duration" in out.stderr
    out = _cli(pg_dsn, "cleanup", "--older-than", "1d", CDC_OUTBOX_COLUMNS__PRESET="debezium")
    assert out.returncode == 2 and "debezium preset has none" in out.stderr
