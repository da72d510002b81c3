"""``cdc-outbox run``: the long-running relay."""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Annotated

import typer

from cdc_outbox.cli.common import global_options, settings_from
from cdc_outbox.cli.progress_bar import catch_up_bar


def register(app: typer.Typer) -> None:
    app.command("run")(run)


def run(
    ctx: typer.Context,
    # Plain strings with the choices as metavar: a wrong value is the settings' one-line
    # error (exit 2), not click's usage box.
    mode: Annotated[
        str | None,
        typer.Option(
            "--mode",
            metavar="cdc|polling|auto",
            help="Relay mode (mode; default auto).",
        ),
    ] = None,
    delivery: Annotated[
        str | None,
        typer.Option(
            "--delivery",
            metavar="at_least_once|exactly_once",
            help="Delivery guarantee (delivery; default at_least_once).",
        ),
    ] = None,
    grace: Annotated[
        float | None,
        typer.Option(
            "--grace",
            metavar="SECONDS",
            help="Seconds to flush and confirm on SIGTERM (shutdown_grace_s).",
        ),
    ] = None,
) -> None:
    """Run the relay until SIGTERM/SIGINT (several may run: one leads, the others stand by).

    The leader follows the durable phase (POLLING, CATCHING_UP, STREAMING); a standby takes
    over when the leader dies or stops renewing its lease. On a signal it stops reading at a
    transaction boundary, waits (up to the grace period) for Kafka to acknowledge what was
    sent, confirms it to the slot and exits 0. On a terminal a catch-up shows a progress bar.
    """
    from cdc_outbox.service.wiring import build_service

    overrides = global_options(ctx).overrides
    if mode is not None:
        overrides["mode"] = mode
    if delivery is not None:
        overrides["delivery"] = delivery
    if grace is not None:
        overrides["shutdown_grace_s"] = grace
    settings = settings_from(ctx)
    service = build_service(settings)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        service.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with catch_up_bar(lambda: service.stats, sys.stderr, settings.log_format):
        service.run()
