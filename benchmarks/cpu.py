"""CPU seconds used by the processes of a benchmark phase (Linux procfs)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from cdc_outbox_dev.sandbox._proc import children

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads) in seconds; 0.0 if it is gone."""
    return _stat_cpu(Path(f"/proc/{pid}/stat"))


def thread_cpu(native_id: int) -> float:
    """utime + stime of one thread of this process (``threading.get_native_id()``)."""
    return _stat_cpu(Path(f"/proc/{os.getpid()}/task/{native_id}/stat"))


def _stat_cpu(path: Path, *, reaped: bool = False) -> float:
    """utime + stime from a stat file; with ``reaped`` also cutime + cstime (the CPU of
    children that exited and were waited for)."""
    own, children_cpu = _stat_parts(path)
    return own + children_cpu if reaped else own


def _stat_parts(path: Path) -> tuple[float, float]:
    """(utime + stime, cutime + cstime) in seconds from one read of a stat file."""
    try:
        fields = path.read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0, 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK, (int(fields[13]) + int(fields[14])) / _TICK


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root``, its live direct children and the children it has reaped (e.g. a
    postmaster and its backends: a backend's CPU moves to the postmaster's count when it
    exits, so the total never drops). A child reaped while its siblings are read would be
    counted nowhere (or twice): the reading is repeated until the reaped part held still."""
    path = Path(f"/proc/{root}/stat")
    for _ in range(20):
        _own, reaped = _stat_parts(path)
        live = sum(process_cpu(pid) for pid in children(root))
        own, reaped_after = _stat_parts(path)
        if reaped_after == reaped:
            break
    return own + reaped_after + live


class CpuMeter:
    """Snapshot CPU of named probes before and after a phase; report per wall second.

    Processes that exit during the phase are counted only when their parent is a
    :func:`tree_cpu` root that waited for them (e.g. PostgreSQL backends): probe long-lived
    processes (the relay itself, the broker, the postmaster tree).
    """

    def __init__(self, probes: dict[str, Callable[[], float]]) -> None:
        self._probes = probes
        self._start: dict[str, float] = {}

    def with_probes(self, probes: dict[str, Callable[[], float]]) -> CpuMeter:
        """A meter of this one's probes and ``probes`` (replacing those of the same name)."""
        return CpuMeter({**self._probes, **probes})

    def start(self) -> None:
        self._start = {name: probe() for name, probe in self._probes.items()}

    def seconds(self) -> dict[str, float]:
        """CPU seconds used by each probe since :meth:`start`."""
        return {name: probe() - self._start[name] for name, probe in self._probes.items()}

    def cores_used(self, wall_s: float) -> dict[str, float]:
        """Average cores used by each probe since :meth:`start`."""
        return {
            name: round((probe() - self._start[name]) / wall_s, 2)
            for name, probe in self._probes.items()
        }
