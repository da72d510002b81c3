"""eos_start.meanwhile: the fencing call and the topic check overlap; errors reach the caller."""

from __future__ import annotations

import threading

import pytest

from cdc_outbox.cdc.eos_start import meanwhile


def test_both_run_and_overlap() -> None:
    both = threading.Barrier(2, timeout=10)  # each waits for the other: they overlap
    assert meanwhile(both.wait, both.wait) is True


def test_an_error_of_the_helper_is_raised_on_the_callers_thread() -> None:
    def helper() -> None:
        raise ConnectionError("no broker")

    with pytest.raises(ConnectionError, match="no broker"):
        meanwhile(lambda: None, helper)


def test_an_error_of_main_wins_and_the_helper_is_joined() -> None:
    done = threading.Event()

    def main() -> None:
        raise TimeoutError("fencing timed out")

    with pytest.raises(TimeoutError):
        meanwhile(main, done.set)
    assert done.is_set()
