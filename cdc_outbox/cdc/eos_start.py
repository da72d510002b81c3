"""A session start of the exactly-once relay pays one broker round trip less: fencing (which
must come first) and ensuring the checkpoint topic (which needs no fencing) overlap."""

from __future__ import annotations

import threading
from collections.abc import Callable


def meanwhile(main: Callable[[], None], helper: Callable[[], None]) -> bool:
    """Run ``main`` on this thread while ``helper`` runs on a helper thread; True if
    ``helper`` finished. Raises what ``main`` raised, else what ``helper`` raised."""
    outcome: list[Exception | None] = []

    def run_helper() -> None:
        try:
            helper()
        except Exception as exc:  # re-raised on the caller's thread
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run_helper, name="eos-checkpoint-topic", daemon=True)
    thread.start()
    try:
        main()
    finally:
        thread.join()
    if outcome and outcome[0] is not None:
        raise outcome[0]
    return bool(outcome)
