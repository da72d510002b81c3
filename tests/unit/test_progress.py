"""cdc_outbox.telemetry.progress: rate, ETA and when a progress line is due."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.telemetry.progress import Progress


def test_rate_eta_and_line() -> None:
    p = Progress(total=1000, started=100.0, done=250)
    assert p.rate(110.0) == 25.0
    assert p.eta(110.0) == 30.0
    assert p.line(110.0) == "250/1000 rows (25%), 25 rows/s, ETA 30s"


def test_no_rate_yet_and_done() -> None:
    assert Progress(total=10, started=5.0).eta(5.0) is None
    assert Progress(total=10, started=5.0, done=10).eta(5.0) == 0.0
    assert Progress(total=0, started=0.0).fraction() == 1.0


def test_due_at_most_once_per_interval() -> None:
    p = Progress(total=10, started=0.0)
    assert p.due(0.0, 10.0)
    assert not p.due(9.9, 10.0)
    assert p.due(10.0, 10.0)


@given(
    total=st.integers(0, 10**9),
    done=st.integers(0, 10**9),
    elapsed=st.floats(0.001, 1e6),
)
def test_eta_finishes_the_job_at_the_rate(total: int, done: int, elapsed: float) -> None:
    p = Progress(total=total, started=0.0, done=done)
    eta = p.eta(elapsed)
    assert 0.0 <= p.fraction() <= 1.0
    if done >= total:
        assert eta == 0.0
    elif done == 0:
        assert eta is None
    else:
        assert eta is not None
        assert abs(p.rate(elapsed) * eta - (total - done)) <= 1e-6 * total


@given(st.lists(st.floats(0.0, 1e4), min_size=1, max_size=50), st.floats(0.1, 100.0))
def test_logged_lines_are_an_interval_apart(steps: list[float], interval: float) -> None:
    p = Progress(total=1, started=0.0)
    now, logged = 0.0, []
    for step in steps:
        now += step
        if p.due(now, interval):
            logged.append(now)
    assert logged and logged[0] == steps[0]
    assert all(b - a >= interval for a, b in itertools.pairwise(logged))
