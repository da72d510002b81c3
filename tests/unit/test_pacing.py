"""pacing.send_now: records go out at once exactly when the relay produces no more for now."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.cdc.pacing import BEHIND_S, caught_up, send_now


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
