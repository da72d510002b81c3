"""Reading an exactly-once relay's topics back: the isolation levels a reader may use and the
tally of every stored event against the records read."""

from __future__ import annotations

from cdc_outbox.config.settings import Settings
from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import read_topics

COMMITTED = {"isolation.level": "read_committed"}
UNCOMMITTED = {"isolation.level": "read_uncommitted"}


def tally(
    dsn: str, settings: Settings, bootstrap: str, prefix: str, config: dict[str, str]
) -> workload.Tally:
    """Every event stored in the outbox against the records of ``<prefix>.event.*`` read with
    ``config`` (:data:`COMMITTED` or :data:`UNCOMMITTED`); the verdict is printed."""
    expected = workload.stored_events(dsn, columns=settings.column_names())
    records = read_topics(bootstrap, f"{prefix}.event.", timeout=120, extra_config=config)
    verdict = workload.tally(expected, records)
    print(f"{config['isolation.level']}: {verdict.summary()}")
    return verdict
