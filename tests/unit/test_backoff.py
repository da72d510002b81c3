"""cdc_outbox.config.backoff: the one retry back-off rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.config.backoff import Backoff, BackoffPolicy, doubling


def test_doubling_from_the_first_delay_up_to_the_cap() -> None:
    assert [doubling(n, 0.5, 30.0) for n in range(0, 9)] == [
        0.5, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0
    ]  # fmt: skip
    assert doubling(10**6, 0.5, 30.0) == 30.0  # no overflow


@given(st.lists(st.sampled_from(["fail", "fail10", "reset"]), max_size=40))
def test_the_loop_state_is_the_same_rule(steps: list[str]) -> None:
    backoff, failures = Backoff(BackoffPolicy(0.5, 30.0)), 0
    for step in steps:
        if step == "reset":
            backoff.reset()
            failures = 0
        elif step == "fail":
            expected = backoff.delay
            assert backoff.failed() == expected
            failures += 1
            assert expected <= 30.0
        else:
            assert backoff.failed(10.0) <= 30.0
            assert backoff.delay <= 10.0
    if all(s == "fail" for s in steps):
        assert backoff.delay == doubling(len(steps) + 1, 0.5, 30.0)
