"""A catch-up progress bar on a terminal, for ``cdc-outbox run``.

Contract of :func:`catch_up_bar`: only when ``stream`` is a terminal and logs are text lines
(not ``log_format = "json"``, not a pipe, a file or a container's log), a live region drawn
with ``rich`` shows, while ``stats().catch_up_progress`` is set, a bar and the line of
:meth:`cdc_outbox.telemetry.progress.Progress.line` (rows done/total, rate, ETA: the same numbers as
the log lines and metrics); otherwise it does nothing. While it runs, the cdc-outbox log
handler writes through the live region, so log lines scroll above the bar intact; both are
restored on exit. The relay's code never touches the terminal: this reads its stats.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import TextIO, cast

from rich.console import Console, Group, RenderableType
from rich.file_proxy import FileProxy
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from cdc_outbox.telemetry.relay_stats import RelayStats

__all__ = ["catch_up_bar", "render"]

#: Redraws per second of the live region.
REFRESH_PER_SECOND = 2.0


def render(stats: RelayStats, now: float) -> RenderableType:
    """The bar for ``stats`` at monotonic time ``now``: nothing while no catch-up runs."""
    progress = stats.catch_up_progress
    if progress is None:
        return Group()
    row = Table.grid(padding=(0, 1))
    row.add_column(no_wrap=True)
    row.add_column(width=30)
    row.add_column(no_wrap=True)
    total = max(progress.total, 1)
    bar = ProgressBar(total=total, completed=progress.fraction() * total, width=30)
    row.add_row("catch-up", bar, progress.line(now))
    return row


def _log_handlers(stream: TextIO) -> list[logging.StreamHandler[TextIO]]:
    """The root logger's cdc-outbox handlers writing to ``stream`` (cli.common.setup_logging)."""
    return [
        h
        for h in logging.getLogger().handlers
        if getattr(h, "_cdc_outbox", False)
        and isinstance(h, logging.StreamHandler)
        and h.stream is stream
    ]


@contextlib.contextmanager
def catch_up_bar(
    stats: Callable[[], RelayStats], stream: TextIO, log_format: str
) -> Iterator[None]:
    """Show the catch-up bar on ``stream`` while the block runs (see the module contract)."""
    if log_format != "text" or not stream.isatty():
        yield
        return
    console = Console(file=stream, force_terminal=True, highlight=False, soft_wrap=True)
    live = Live(
        console=console,
        get_renderable=lambda: render(stats(), time.monotonic()),
        refresh_per_second=REFRESH_PER_SECOND,
        transient=True,
        redirect_stdout=False,
        redirect_stderr=False,  # the log handler is pointed at the console below instead
    )
    handlers = _log_handlers(stream)
    proxy = cast(TextIO, FileProxy(console, stream))  # a text stream, typed as io.TextIOBase
    with live:
        for handler in handlers:
            handler.setStream(proxy)
        try:
            yield
        finally:
            for handler in handlers:
                handler.setStream(stream)
            proxy.flush()
