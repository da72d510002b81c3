"""The catch-up progress bar of ``cdc-outbox run`` (cdc_outbox.cli.progress_bar): drawn only on
a terminal with text logs, from the pure progress core, with log lines intact above it."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Callable, Iterator

import pytest
from rich.console import Console

from cdc_outbox.cli import common
from cdc_outbox.cli.progress_bar import catch_up_bar, render
from cdc_outbox.telemetry.progress import Progress
from cdc_outbox.telemetry.relay_stats import RelayStats
from tests.support.helpers import wait_until

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class FakeTty(io.StringIO):
    def __init__(self, tty: bool = True) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def log_to(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[FakeTty, str], None]]:
    """Sets up the cdc-outbox log handler on a given stream; restores the root logger."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)

    def setup(stream: FakeTty, fmt: str) -> None:
        monkeypatch.setattr(common.sys, "stderr", stream)
        common.setup_logging("INFO", fmt)

    yield setup
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def _plain(stream: FakeTty) -> str:
    return ANSI.sub("", stream.getvalue())


def test_a_terminal_shows_the_bar_with_the_progress_line_and_intact_log_lines(
    log_to: Callable[[FakeTty, str], None],
) -> None:
    tty = FakeTty()
    log_to(tty, "text")
    stats = RelayStats()
    log = logging.getLogger("cdc_outbox.test")
    with catch_up_bar(lambda: stats, tty, "text"):
        stats.catch_up_progress = Progress(total=1000, started=time.monotonic() - 10, done=250)
        wait_until(lambda: "catch-up" in _plain(tty), message=lambda: repr(tty.getvalue()))
        log.info("catch-up progress: 250/1000 rows")
        stats.catch_up_progress.done = 1000
        wait_until(lambda: "1000/1000 rows (100%)" in _plain(tty), message=lambda: _plain(tty))
    text = _plain(tty)
    bar = re.search(r"catch-up [━╸╺]+ 250/1000 rows \(25%\), \d+ rows/s, ETA \d+s", text)
    assert bar, text
    # the log line is written whole, on a line of its own, through the live region
    assert re.search(r"(^|[\r\n])[0-9-]+ [0-9:,]+ INFO cdc_outbox.test: catch-up progress:"
                     r" 250/1000 rows\n", text), text  # fmt: skip
    # afterwards the handler writes to the stream itself again (no bar, no redraw codes)
    before = tty.getvalue()
    log.info("after")
    assert tty.getvalue()[len(before) :].endswith("INFO cdc_outbox.test: after\n")
    assert "\x1b" not in tty.getvalue()[len(before) :]


@pytest.mark.parametrize(("tty", "fmt"), [(False, "text"), (True, "json")])
def test_no_bar_without_a_terminal_or_with_json_logs(
    log_to: Callable[[FakeTty, str], None], tty: bool, fmt: str
) -> None:
    stream = FakeTty(tty)
    log_to(stream, fmt)
    stats = RelayStats(catch_up_progress=Progress(total=10, started=time.monotonic(), done=3))
    with catch_up_bar(lambda: stats, stream, fmt):
        logging.getLogger("cdc_outbox.test").info("one line")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "\x1b" not in stream.getvalue()
    if fmt == "json":
        assert json.loads(lines[0])["message"] == "one line"
    else:
        assert lines[0].endswith("INFO cdc_outbox.test: one line")


def test_render_draws_nothing_while_no_catch_up_runs() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100)
    stats = RelayStats()
    console.print(render(stats, 0.0))
    assert out.getvalue() == ""
    stats.catch_up_progress = Progress(total=0, started=0.0)  # an empty backlog: 100 %
    console.print(render(stats, 1.0))
    assert "catch-up" in out.getvalue()
    assert "0/0 rows (100%), 0 rows/s, ETA 0s" in out.getvalue()
