"""How :meth:`Relay.run` ends (issue 37, item 0): only a stop request ends it without an
error; a leadership that lapsed is latched where it is seen, even if a late renew makes
``is_leader()`` True again while the relay closes.

The real Relay, driven through its ports by the fakes of tests/fakes (the relay-level
``Harness``), with an ``is_leader`` that says False exactly once, at a chosen call: the
timing a paused process or a slow renew gives, forced.
"""

from __future__ import annotations

import threading

import pytest

from cdc_outbox.cdc.relay import Relay
from cdc_outbox.errors import PrivilegeMissing
from cdc_outbox.store.relay_state import NotLeader
from tests.support.relay_harness import Harness


class Blip:
    """``is_leader`` that is False on call number ``at`` only (a term that lapsed and that a
    late renew seemed to revive), True otherwise; counts calls."""

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls != self.at


def _relay(h: Harness, is_leader: Blip) -> Relay:
    return h.relay(is_leader=is_leader)


def _run(relay: Relay, timeout: float = 30.0) -> BaseException | None:
    """``relay.run()`` on a thread, never asked to stop: what it raised (None: it returned)."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            relay.run()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the relay neither returned nor raised within 30 s"
    return outcome[0]


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
@pytest.mark.parametrize("at", [1, 2, 40, 400])
def test_a_lapse_seen_once_ends_run_with_not_leader(delivery: str, at: int) -> None:
    h = Harness(delivery)
    for n in range(300):
        h.pg.commit([f"agg-{n % 7}", f"agg-{(n + 1) % 7}"])
    blip = Blip(at)
    ended = _run(_relay(h, blip))
    assert blip.calls >= at, "the blip was never reached: the test proves nothing"
    assert isinstance(ended, NotLeader), f"run ended with {ended!r}, not NotLeader"


def test_run_ends_without_an_error_only_on_a_stop_request() -> None:
    h = Harness("at_least_once")
    h.pg.commit(["agg-1"])
    relay = _relay(h, Blip(at=0))  # never False
    with h.running(relay) as caught_up:  # asks to stop on exit and fails on any error
        caught_up()


def test_replication_revoked_in_cdc_mode_is_a_privilege_error_not_retried() -> None:
    h = Harness("at_least_once")
    h.pg.commit(["agg-1"])
    h.stream.refuse_connect(
        "replication connection failed: connection to server failed: FATAL:  permission"
        " denied to start WAL sender DETAIL:  Only roles with the REPLICATION attribute may"
        " start a WAL sender process."
    )
    ended = _run(_relay(h, Blip(at=0)))
    assert isinstance(ended, PrivilegeMissing), repr(ended)
    assert "lacks REPLICATION" in str(ended) and "ALTER ROLE" in str(ended)
