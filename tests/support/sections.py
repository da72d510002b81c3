"""Components built from whole settings the way the wiring builds them (the config section
functions, issue 35): one line for a test that holds a ``Settings``."""

from __future__ import annotations

from collections.abc import Callable

from cdc_outbox.config.ha import leadership_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.ha.leadership import Leadership
from cdc_outbox.store import schema


def leadership(
    settings: Settings,
    instance_id: str | None = None,
    *,
    loop_stalled: Callable[[], str | None] | None = None,
) -> Leadership:
    """:class:`Leadership` of ``settings``' slot, as ``cdc-outbox run`` elects it."""
    return Leadership(
        leadership_section(settings),
        schema.relay_state_ident(settings),
        instance_id,
        loop_stalled=loop_stalled,
    )
