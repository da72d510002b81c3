"""The lag dashboard in real headless Chromium (Debian's ``chromium``) against a running relay
under load: with Kafka stopped, slot lag and the oldest-unpublished age rise on the endpoint,
in ``cdc-outbox lag --json`` and on the dashboard, which agree; after Kafka is back they fall
to near zero by themselves. The screenshot is kept as test-artifacts/dashboard.png.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from typing import Any

from cdc_outbox.lsn import Lsn
from tests.support.helpers import wait_until
from tests.support.monitoring import lag_json, load_thread, monitored_settings, scrape
from tests.support.relay import init_outbox, service_thread
from tests.support.relay_process import ARTIFACTS

MIB = 2**20
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run", "--hide-scrollbars", "--window-size=1400,1250",
)  # fmt: skip


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is required: apt-get install -y chromium"
    return path


def run_chromium(url: str, *args: str) -> str:
    """Load ``url`` (letting its timers run for 4 s of virtual time); stdout of chromium."""
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
             "--virtual-time-budget=4000", *args, url],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


class _Figures(HTMLParser):
    """``data-value`` of every ``data-metric`` element, plus the body's data attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.values["_ready"] = a.get("data-ready") or ""
            self.values["_samples"] = a.get("data-samples") or "0"
        elif a.get("data-metric"):
            self.values[str(a["data-metric"])] = a.get("data-value") or ""


def dashboard_figures(url: str) -> dict[str, str] | None:
    """The figures the dashboard shows, once it has rendered a sample (else None)."""
    parser = _Figures()
    parser.feed(run_chromium(url, "--dump-dom"))
    return parser.values if parser.values.get("_ready") == "1" else None


def num(figures: dict[str, Any], key: str) -> float:
    return float(figures[key])


def test_dashboard_tracks_a_kafka_outage_and_agrees_with_lag_json(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    settings = monitored_settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    init_outbox(settings)
    url = f"http://127.0.0.1:{settings.metrics_port}/dashboard"
    with service_thread(settings) as service, load_thread(pg_dsn, settings, rate=250):
        wait_until(lambda: service.stats.events_published >= 300, timeout=90)
        # The page shows the monitor's latest sample, which may predate the 300th event.
        healthy = wait_until(
            lambda: (f := dashboard_figures(url)) and num(f, "events_published_total") >= 300 and f,
            timeout=60,
        )
        assert healthy["mode"] == "cdc" and healthy["slot_active"] == "true"
        assert healthy["delivery"] == "at_least_once"  # the guarantee in effect
        assert num(healthy, "events_published_total") >= 300
        assert num(healthy, "slot_lag_bytes") < 16 * MIB

        kafka_broker.stop()
        try:
            wait_until(
                lambda: (
                    (m := scrape(settings))["cdc_outbox_slot_lag_bytes"] > MIB
                    and m["cdc_outbox_oldest_unpublished_age_seconds"] > 20
                ),
                timeout=180,
                interval=0.5,
                message=lambda: str(scrape(settings)),
            )
            dash, cli = wait_until(lambda: _agreeing(url, settings), timeout=120, interval=0.5)
            peak_lag = num(cli, "slot_lag_bytes")
            peak_age = num(cli, "oldest_unpublished_age_seconds")
            assert (
                num(dash, "slot_lag_bytes") > MIB
                and num(dash, "oldest_unpublished_age_seconds") > 20
            )
        finally:
            kafka_broker.start()

        def recovered() -> bool:
            m = scrape(settings)
            lag, age = (
                m["cdc_outbox_slot_lag_bytes"],
                m["cdc_outbox_oldest_unpublished_age_seconds"],
            )
            return lag < min(MIB, peak_lag / 4) and age < min(10.0, peak_age / 2)

        wait_until(recovered, timeout=240, interval=0.5, message=lambda: str(scrape(settings)))
        after = wait_until(lambda: _recovered_on_dashboard(url, peak_lag, peak_age), timeout=120)
        cli_after = lag_json(settings)
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "dashboard.png"
        shot.unlink(missing_ok=True)
        run_chromium(url, f"--screenshot={shot}")
    assert after["mode"] == "cdc" and after["slot_active"] == "true"
    assert int(after["_samples"]) >= 20  # the charts hold the whole episode
    assert cli_after["slot_lag_bytes"] < min(MIB, peak_lag / 4)
    assert cli_after["oldest_unpublished_age_seconds"] < min(10.0, peak_age / 2)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def _agreeing(url: str, settings: Any) -> tuple[dict[str, str], dict[str, Any]] | None:
    """Dashboard figures and then ``lag --json``, if they agree (else None: try again).

    While Kafka is down the slot's confirmed and restart positions stand still, so both views
    must show the same positions; WAL only grows, so the later CLI reading shows at least the
    dashboard's lag, by exactly the WAL written in between; both ages come from the relay's
    WAL clock, so they differ by the time between the two samples.
    """
    dash = dashboard_figures(url)
    cli = lag_json(settings)
    relay = cli["relay"]
    if dash is None or relay is None or cli["confirmed_flush_lsn"] != dash["confirmed_flush_lsn"]:
        return None
    if cli["restart_lsn"] != dash["restart_lsn"]:
        return None
    confirmed = Lsn.parse(dash["confirmed_flush_lsn"])
    assert num(dash, "slot_lag_bytes") == Lsn.parse(dash["wal_lsn"]) - confirmed
    assert cli["slot_lag_bytes"] == Lsn.parse(cli["wal_lsn"]) - confirmed
    assert cli["slot_lag_bytes"] - num(dash, "slot_lag_bytes") == (
        Lsn.parse(cli["wal_lsn"]) - Lsn.parse(dash["wal_lsn"])
    )
    assert cli["slot_lag_bytes"] >= num(dash, "slot_lag_bytes")
    assert cli["slot_retained_wal_bytes"] - num(dash, "slot_retained_wal_bytes") == (
        cli["slot_lag_bytes"] - num(dash, "slot_lag_bytes")
    )
    between = relay["sampled_at"] - num(dash, "sampled_at")
    age_gap = cli["oldest_unpublished_age_seconds"] - num(dash, "oldest_unpublished_age_seconds")
    assert abs(age_gap - between) < 1.0, (age_gap, between)
    assert dash["slot_wal_status"] == cli["slot_wal_status"] and dash["mode"] == cli["mode"]
    return dash, cli


def _recovered_on_dashboard(url: str, peak_lag: float, peak_age: float) -> dict[str, str] | None:
    dash = dashboard_figures(url)
    if dash is None:
        return None
    lag, age = num(dash, "slot_lag_bytes"), num(dash, "oldest_unpublished_age_seconds")
    return dash if lag < min(MIB, peak_lag / 4) and age < min(10.0, peak_age / 2) else None
