"""pacing.send_now: records go out at once exactly when the relay produces no more for now;
pacing.Linger: held at most LINGER_S, and only while transactions keep coming."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from cdc_outbox.cdc.pacing import (
    BEHIND_S,
    BUSY_S,
    BUSY_SENDS,
    LINGER_S,
    Linger,
    caught_up,
    send_now,
)


def test_caught_up_with_records_waiting_sends_now() -> None:
    assert send_now(1, caught_up=True, reading=True)


def test_not_reading_with_records_waiting_sends_now() -> None:
    assert send_now(5, caught_up=False, reading=False)


def test_while_reading_records_linger() -> None:
    assert not send_now(1000, caught_up=False, reading=True)


def test_nothing_waiting_nothing_to_send() -> None:
    assert not send_now(0, caught_up=True, reading=False)


@given(st.integers(min_value=0, max_value=10**6), st.booleans(), st.booleans())
def test_sends_now_iff_records_wait_and_no_more_are_coming(
    waiting: int, caught_up: bool, reading: bool
) -> None:
    more_coming = reading and not caught_up
    assert send_now(waiting, caught_up=caught_up, reading=reading) == (
        waiting > 0 and not more_coming
    )


@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=50), st.booleans()), min_size=1, max_size=200
    )
)
def test_model_a_record_never_lingers_past_the_turn_that_caught_up(
    turns: list[tuple[int, bool]],
) -> None:
    """Replaying turns (records produced, did the turn end caught up): after every turn that
    caught up, nothing produced so far is left lingering; records linger only across turns
    that kept reading."""
    lingering = 0
    for produced, idle in turns:
        lingering += produced
        if send_now(lingering, caught_up=idle, reading=True):
            lingering = 0
        if idle:
            assert lingering == 0
    assert lingering <= sum(p for p, _ in turns)


def test_an_empty_read_close_behind_the_server_is_caught_up() -> None:
    assert caught_up(True, 0.0)  # no transaction read yet, or one still open
    assert caught_up(True, BEHIND_S)


def test_an_empty_read_far_behind_is_a_pause_of_a_backlog() -> None:
    assert not caught_up(True, BEHIND_S + 0.001)
    assert not caught_up(True, 30.0)


@given(st.booleans(), st.floats(min_value=-60, max_value=60, allow_nan=False))
def test_caught_up_needs_an_empty_read_and_a_recent_commit(read_empty: bool, lag: float) -> None:
    assert caught_up(read_empty, lag) == (read_empty and lag <= BEHIND_S)
    if not read_empty:  # reading: never caught up, records linger
        assert not send_now(1, caught_up=caught_up(read_empty, lag), reading=True)


def _sends(linger: Linger, gaps: list[float], seen: list[float] | None = None) -> list[float]:
    """Caught-up sends, each ``gap`` s after the previous one ended; the holds asked. ``seen``
    gets each gap as the clock gives it (``now - end``: floats, not ``gap`` exactly)."""
    now, end, holds = 0.0, float("-inf"), []
    for gap in gaps:
        now += gap
        if seen is not None:
            seen.append(now - end)
        hold = linger.hold_s(now)
        now += hold
        linger.sent(now)
        end = now
        holds.append(hold)
    return holds


def test_a_lone_transaction_is_never_held() -> None:
    assert _sends(Linger(), [1.0]) == [0.0]
    assert _sends(Linger(), [0.05] * 20) == [0.0] * 20  # 20 transactions/s


def test_transactions_that_keep_coming_are_held_from_the_busy_streak_on() -> None:
    holds = _sends(Linger(), [0.0005] * 10)
    assert holds == [0.0] * BUSY_SENDS + [LINGER_S] * (10 - BUSY_SENDS)


def test_a_pause_ends_the_streak() -> None:
    holds = _sends(Linger(), [*[0.0005] * 10, 2 * BUSY_S, *[0.0005] * BUSY_SENDS])
    assert holds[10:] == [0.0] * BUSY_SENDS + [LINGER_S]


@given(st.lists(st.floats(min_value=0, max_value=0.1), max_size=100))
@example([0.0] * 5 + [BUSY_S])  # the clock's gap is 0.004999...: the rule sees that, not 0.005
def test_a_hold_is_linger_s_or_nothing_and_needs_a_streak(gaps: list[float]) -> None:
    seen: list[float] = []
    holds = _sends(Linger(), gaps, seen)
    for n, hold in enumerate(holds):
        assert hold in (0.0, LINGER_S)
        recent = seen[max(0, n - BUSY_SENDS + 1) : n + 1]
        if hold:  # the BUSY_SENDS gaps up to it were all short
            assert n >= BUSY_SENDS and all(g < BUSY_S for g in recent)
