"""``cdc-outbox lag``: slot lag, retained WAL and the oldest unpublished event.

The database figures are read fresh by this command (any role that can run ``status``). When
the relay's endpoint answers (``metrics_host:metrics_port``, or ``--relay-url``) its current
sample is added under ``relay``: mode, throughput, commit-to-ack latency, in-flight events,
and - in CDC mode, where only the running relay can tell - the oldest unpublished age.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import psycopg
import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cdc_outbox.admin import lifecycle
from cdc_outbox.cli.common import print_json, scrub, settings_from, stdout
from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import CdcOutboxError
from cdc_outbox.monitoring.lag import (
    LagSample,
    outbox_columns,
    read_outboxes,
    read_polling,
    read_slot,
)
from cdc_outbox.store.outbox_table import OutboxTable

#: Top-level keys of ``lag --json`` (the rest of a relay sample appears under ``relay``).
DATABASE_KEYS = (
    "sampled_at", "slot_name", "wal_lsn", "slot_present", "slot_active", "slot_active_pid",
    "confirmed_flush_lsn", "restart_lsn", "slot_lag_bytes", "slot_retained_wal_bytes",
    "slot_wal_status", "slot_safe_wal_size_bytes", "slot_spill_txns", "slot_spill_count",
    "slot_spill_bytes", "slot_stream_txns", "slot_stream_count", "slot_stream_bytes",
    "slot_total_txns", "slot_total_bytes", "oldest_unpublished_age_seconds", "polling_pending",
    "polling_processing", "polling_failed", "polling_retrying_rows", "polling_retry_attempts",
    "outboxes", "mode",
)  # fmt: skip
_SPARK = "▁▂▃▄▅▆▇█"


def register(app: typer.Typer) -> None:
    app.command("lag")(lag)


def lag(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="Live view, refreshed every --interval seconds.")
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.2, help="Seconds between refreshes (--watch).")
    ] = 2.0,
    relay_url: Annotated[
        str | None,
        typer.Option("--relay-url", help="Relay endpoint (default: from metrics_host/port)."),
    ] = None,
    iterations: Annotated[int, typer.Option("--iterations", hidden=True, min=0)] = 0,
) -> None:
    """Show slot lag, retained WAL, wal_status and the oldest unpublished event.

    One-shot table (or --json); --watch keeps a live view (with --json: one JSON line per
    refresh) until Ctrl-C. Exit 1 if the database cannot be reached (one-shot only).
    """
    settings = settings_from(ctx)
    url = relay_url if relay_url is not None else default_relay_url(settings)
    if not watch:
        with lifecycle.connect(settings) as conn:
            doc = collect(settings, conn, url)
        if json_out:
            print_json(doc)
        else:
            stdout.print(render(doc))
        return
    with contextlib.suppress(KeyboardInterrupt):
        _watch(settings, url, json_out, interval, iterations)


def default_relay_url(settings: Settings) -> str | None:
    """``http://host:port`` of the configured endpoint (None when metrics are disabled)."""
    if not settings.metrics_port:
        return None
    host = settings.metrics_host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.metrics_port}"


def fetch_relay(url: str | None, timeout: float = 2.0) -> tuple[dict[str, Any] | None, str | None]:
    """(the relay's current sample, None) or (None, why not)."""
    if url is None:
        return None, "metrics endpoint disabled (metrics_port = 0)"
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/api/lag", timeout=timeout) as response:
            doc = json.loads(response.read())
    except (OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return None, f"relay not reachable at {url}: {reason}"
    current = doc.get("current") if isinstance(doc, dict) else None
    if not isinstance(current, dict):
        return None, f"relay at {url} has no sample yet"
    return current, None


def collect(settings: Settings, conn: lifecycle.Conn, url: str | None) -> dict[str, Any]:
    """The ``lag --json`` document: fresh database figures plus the relay's sample."""
    relay, relay_error = fetch_relay(url)
    mode = relay.get("mode") if relay else (None if settings.mode == "auto" else settings.mode)
    sample = LagSample(sampled_at=time.time(), slot_name=settings.slot_name, mode=mode)
    tables = OutboxTable.all_of(settings)
    read_slot(conn, settings.slot_name, sample)
    if mode == "polling":
        read_polling(conn, tables, sample, outbox_columns(conn, tables))
    elif relay is not None:
        sample.oldest_unpublished_age_seconds = relay.get("oldest_unpublished_age_seconds")
    read_outboxes(conn, tables, sample)
    data = sample.to_dict()
    doc = {key: data[key] for key in DATABASE_KEYS}
    doc.update(relay=relay, relay_url=url, relay_error=relay_error)
    return doc


# -- rendering ---------------------------------------------------------------------------------


def _bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{value:.1f} {unit} ({int(n)} B)"
        value /= 1024
    return str(n)  # pragma: no cover


def _seconds(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s < 1:
        return f"{s * 1000:.1f} ms"
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _count(n: int | None) -> str:
    return "n/a" if n is None else f"{n:,}"


def _wal_status(status: str | None) -> str:
    color = {"reserved": "green", "extended": "yellow", "unreserved": "red", "lost": "red"}
    return "n/a" if status is None else f"[{color.get(status, 'white')}]{status}[/]"


def render(doc: dict[str, Any], history: Mapping[str, Iterable[float]] | None = None) -> Table:
    """The lag table (``history``: optional sparklines by row label)."""
    table = Table(title="cdc-outbox lag", title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    spark = {k: sparkline(v) for k, v in (history or {}).items()}
    if not doc["slot_present"]:
        table.add_row("slot", f"{doc['slot_name']}: [red]missing[/] (run `cdc-outbox init`)")
    else:
        active = "[green]active[/]" if doc["slot_active"] else "[yellow]inactive[/]"
        table.add_row("slot", f"{doc['slot_name']}: {active}")
        table.add_row("slot lag", f"{_bytes(doc['slot_lag_bytes'])} {spark.get('lag', '')}")
        table.add_row("retained WAL", _bytes(doc["slot_retained_wal_bytes"]))
        table.add_row("wal_status", _wal_status(doc["slot_wal_status"]))
        safe = doc["slot_safe_wal_size_bytes"]
        table.add_row("safe_wal_size", "unlimited" if safe is None else _bytes(safe))
        table.add_row(
            "WAL positions",
            f"current {doc['wal_lsn']}, confirmed {doc['confirmed_flush_lsn']}, "
            f"restart {doc['restart_lsn']}",
        )
        table.add_row(
            "spilled / streamed",
            f"{_count(doc['slot_spill_txns'])} txns ({_bytes(doc['slot_spill_bytes'])}) / "
            f"{_count(doc['slot_stream_txns'])} txns ({_bytes(doc['slot_stream_bytes'])})",
        )
    age = doc["oldest_unpublished_age_seconds"]
    why = "" if age is not None else " (CDC: needs the running relay's endpoint)"
    table.add_row("oldest unpublished", _seconds(age) + why)
    if doc["polling_pending"] is not None:
        table.add_row(
            "polling rows",
            f"pending {doc['polling_pending']:,}, processing {doc['polling_processing']:,}, "
            f"failed {doc['polling_failed']:,}, retrying {doc['polling_retrying_rows']:,}",
        )
    for f in doc.get("outboxes") or []:
        table.add_row(f"outbox {f['outbox']}", _outbox_line(f))
    relay = doc["relay"]
    if relay is None:
        table.add_row("relay", f"[yellow]{doc['relay_error']}[/]")
        return table
    table.add_row("relay", f"{doc['relay_url']} ({relay.get('mode')} mode)")
    rate = relay.get("throughput_events_per_second")
    table.add_row(
        "throughput",
        ("n/a" if rate is None else f"{rate:,.1f} events/s") + " " + spark.get("rate", ""),
    )
    table.add_row(
        "commit→ack latency",
        f"p50 {_seconds(relay.get('latency_p50_seconds'))}, "
        f"p95 {_seconds(relay.get('latency_p95_seconds'))}",
    )
    table.add_row(
        "events",
        f"published {_count(relay.get('events_published_total'))}, dead-lettered "
        f"{_count(relay.get('events_dead_lettered_total'))}, in flight "
        f"{_count(relay.get('in_flight_events'))}, delivery errors "
        f"{_count(relay.get('delivery_errors_total'))}",
    )
    confirmed = relay.get("last_confirm_unix")
    ago = "never" if confirmed is None else f"{_seconds(max(0.0, time.time() - confirmed))} ago"
    table.add_row("last confirmation", f"{relay.get('relay_confirmed_lsn')} ({ago})")
    if relay.get("heartbeats_total") is not None:
        table.add_row(
            "heartbeats",
            f"{relay['heartbeats_total']:,} ok, {relay.get('heartbeat_errors_total', 0):,} failed",
        )
    return table


def _outbox_line(f: Mapping[str, Any]) -> str:
    """One outbox table: unpublished rows, the oldest one's age, dead letters."""
    if not f["exists"]:
        return "[red]missing[/]"
    line = f"{_count(f['unpublished_rows'])} unpublished"
    if f["oldest_unpublished_age_seconds"] is not None:
        line += f", oldest {_seconds(f['oldest_unpublished_age_seconds'])}"
    if f["failed_rows"] is not None:
        line += f", {f['failed_rows']:,} FAILED ({f['parked_aggregates']:,} aggregates parked)"
    return line


def sparkline(values: Iterable[float]) -> str:
    points = list(values)
    if not points:
        return ""
    top = max(points) or 1.0
    return "".join(_SPARK[min(7, int(v / top * 7.999))] for v in points)


def _watch(
    settings: Settings, url: str | None, json_out: bool, interval: float, iterations: int
) -> None:
    history: dict[str, deque[float]] = {"lag": deque(maxlen=40), "rate": deque(maxlen=40)}
    conn: lifecycle.Conn | None = None
    done = 0
    with contextlib.ExitStack() as stack:
        live = None if json_out else stack.enter_context(Live(console=stdout, auto_refresh=False))
        while iterations == 0 or done < iterations:
            started = time.monotonic()
            view: Table | Text
            try:
                if conn is None or conn.closed:
                    conn = lifecycle.connect(settings)
                doc = collect(settings, conn, url)
                history["lag"].append(float(doc["slot_lag_bytes"] or 0))
                rate = (doc["relay"] or {}).get("throughput_events_per_second")
                history["rate"].append(float(rate or 0))
                view, line = render(doc, history), json.dumps(doc, default=str)
            except (CdcOutboxError, psycopg.Error) as exc:
                if conn is not None:
                    conn.close()
                conn = None
                message = scrub(" ".join(str(exc).split()))
                view = Text(f"database not reachable: {message}", style="red")
                line = json.dumps({"error": message})
            if live is None:
                print(scrub(line), flush=True)
            else:
                live.update(Group(view, Text(f"every {interval:g} s; Ctrl-C to stop", "dim")))
                live.refresh()
            done += 1
            if iterations == 0 or done < iterations:
                time.sleep(max(0.0, interval - (time.monotonic() - started)))
    if conn is not None:
        conn.close()
