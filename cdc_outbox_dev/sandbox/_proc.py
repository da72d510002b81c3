"""Process and port helpers shared by the local PostgreSQL and Kafka servers.

Servers run in their own session (``start_new_session=True``) so the server's pid is also its
process-group id: ``kill`` can take down a server with all its children, and a server started by
``cdc-outbox sandbox up`` outlives the CLI and ignores the terminal's signals.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``host:port`` (bind succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def wait_port_free(port: int, timeout: float = 15.0, host: str = "127.0.0.1") -> None:
    """Wait until ``host:port`` can be bound (sockets of a killed server may linger briefly)."""
    try:
        wait_for(lambda: port_is_free(port, host), timeout, f"port {port} to be free")
    except TimeoutError as exc:
        raise RuntimeError(f"port {port} on {host} is in use by another process") from exc


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (Linux procfs; [] elsewhere)."""
    found: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(stat.parent.name))
    return found


def pid_alive(pid: int) -> bool:
    """True when ``pid`` exists and some thread of it still runs (an exited process waiting to
    be reaped is a zombie; a JVM whose main thread ended shows a zombie leader while its other
    threads still run)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    task_stats = [Path(f"/proc/{pid}/stat"), *Path(f"/proc/{pid}/task").glob("*/stat")]
    for stat in task_stats:
        try:
            text = stat.read_text()
        except OSError:
            continue
        # The state follows the parenthesised command name: "Z" zombie, "X" dead.
        if text.rpartition(")")[2].split()[0] not in {"Z", "X"}:
            return True
    return not Path("/proc/self/stat").exists()  # no procfs: trust kill(0)


def cmdline(pid: int) -> str:
    """The command line of ``pid`` with arguments joined by spaces ("" if unknown)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``predicate`` until true; raise ``TimeoutError`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


def exited(pid: int, proc: subprocess.Popen[bytes] | None) -> bool:
    """True once ``pid`` is gone; for our own child ``proc`` (same pid) its exit status decides
    (and is collected, so it does not linger as a zombie)."""
    if proc is not None and proc.pid == pid:
        return proc.poll() is not None
    return not pid_alive(pid)


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group led by ``pid`` (or to ``pid`` alone if it leads none)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def terminate(
    pid: int,
    sig: signal.Signals,
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    """Send ``sig`` to ``pid``, wait up to ``timeout`` s for it to exit, then SIGKILL its group."""

    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    try:
        wait_for(lambda: exited(pid, proc), timeout, f"pid {pid} to exit after {sig.name}")
    except TimeoutError:
        logger.warning(
            "pid %d did not exit %.0fs after %s; sending SIGKILL", pid, timeout, sig.name
        )
        kill_group(pid, proc)


def kill_group(pid: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 30) -> None:
    """SIGKILL ``pid``, its process group and its direct children (which may have left the
    group, as PostgreSQL backends do); wait until all of them are gone."""
    kids = children(pid)
    signal_group(pid, signal.SIGKILL)
    for kid in kids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(kid, signal.SIGKILL)

    def gone() -> bool:
        return exited(pid, proc) and not any(pid_alive(kid) for kid in kids)

    wait_for(gone, timeout, f"pid {pid} to die after SIGKILL")


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a text file, for error messages ("" if unreadable)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
