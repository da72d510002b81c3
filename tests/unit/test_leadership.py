"""Leader election, pure parts: lock key, connection parameters, stuck rule, self-fencing clock."""

from __future__ import annotations

import os
import socket

import pytest

from cdc_outbox.config.settings import Settings
from cdc_outbox.ha.leadership_rules import (
    LeaseClock,
    connection_params,
    holder_is_stuck,
    lock_namespace,
)
from tests.support.sections import leadership


def test_lock_namespace_is_a_fixed_int4() -> None:
    # Pinned: every version of cdc-outbox must compute the same key, or two instances of
    # different versions would both become leader.
    assert lock_namespace() == 1537055762
    assert lock_namespace("cdc_outbox.leader") == lock_namespace()
    for name in ("", "x", "cdc_outbox.other", "é" * 100):
        assert -(2**31) <= lock_namespace(name) < 2**31
    assert lock_namespace("cdc_outbox.other") != lock_namespace()


def test_connection_params_bound_dead_peer_detection_by_the_lease() -> None:
    params = connection_params(5.0, {})
    assert params["application_name"] == "cdc-outbox leader"
    assert params["keepalives"] == 1
    assert (params["keepalives_idle"], params["keepalives_interval"]) == (2, 1)
    assert params["keepalives_count"] == 3
    assert params["tcp_user_timeout"] == 2500
    assert params["connect_timeout"] == 5
    assert connection_params(1.0, {})["tcp_user_timeout"] == 500
    assert connection_params(1.0, {})["connect_timeout"] == 2  # libpq's minimum
    assert "connect_timeout" not in connection_params(5.0, {"connect_timeout": "30"})


@pytest.mark.parametrize(
    ("lease_left", "idle", "stuck"),
    [
        (3.0, 100.0, False),  # lease still valid: never, however idle the session
        (0.0, 100.0, False),  # expires right now: not yet
        (-0.1, 2.6, True),  # expired, session silent for over half a lease
        (-0.1, 2.4, False),  # expired but the session did something recently
        (-30.0, None, True),  # session activity not visible: the lease decides
        (None, 3.0, True),  # no lease in the row (cleared) and silent
        (None, 0.2, False),  # no lease in the row, but a fresh holder (still writing it)
    ],
)
def test_holder_is_stuck(lease_left: float | None, idle: float | None, stuck: bool) -> None:
    assert holder_is_stuck(lease_left, idle, 5.0) is stuck


def test_lease_clock_self_fences_after_the_margin() -> None:
    now = [100.0]
    clock = LeaseClock(2.5, clock=lambda: now[0])
    assert not clock.valid()  # never renewed
    clock.renewed(100.0)
    now[0] = 102.0
    assert clock.valid()
    clock.renewed(101.9)  # a renew that *started* at 101.9 counts from then, not from its end
    now[0] = 104.4
    assert clock.valid()
    now[0] = 104.41  # e.g. the process was stopped: invalid before any renew runs again
    assert not clock.valid()
    clock.reset()
    assert not clock.valid()


def test_a_lapsed_lease_clock_stays_lapsed_until_a_new_term() -> None:
    # Issue 37, item 0: a renew that completes after the lapse was seen (it started in time, or
    # the renew thread ran late) must not revive the term: whoever saw False has acted on it.
    now = [100.0]
    clock = LeaseClock(2.5, clock=lambda: now[0])
    clock.renewed(100.0)
    now[0] = 102.51
    assert not clock.valid()
    clock.renewed(102.0)
    assert not clock.valid()
    clock.renewed(102.51)
    assert not clock.valid()
    clock.reset()  # acquire: a new term
    clock.renewed(102.51)
    assert clock.valid()


def test_new_instance_is_standby_without_io() -> None:
    settings = Settings.model_validate({"dsn": "host=127.0.0.1 port=1 password=hunter2"})
    lead = leadership(settings)
    host, pid, suffix = lead.instance_id.rsplit(":", 2)
    assert (host, pid) == (socket.gethostname(), str(os.getpid()))
    assert len(suffix) == 8
    assert leadership(settings).instance_id != lead.instance_id
    assert lead.is_leader() is False
    assert lead.role == "standby"
    assert lead.describe() == {
        "role": "standby",
        "instance_id": lead.instance_id,
        "leader_id": None,
    }
    assert leadership(settings, instance_id="a").instance_id == "a"
    lead.release()  # nothing to release: no error
