"""Process/port helpers of cdc_outbox_dev.sandbox and the sandbox's small pure pieces."""

from __future__ import annotations

import dataclasses
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cdc_outbox_dev.sandbox import SandboxInfo, _proc
from cdc_outbox_dev.sandbox.kafka import api_versions_ok
from cdc_outbox_dev.sandbox.kafka_jars import _POM


def test_free_port_is_bindable_and_port_is_free_sees_listeners() -> None:
    port = _proc.free_port()
    assert _proc.port_is_free(port)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert not _proc.port_is_free(port)


def test_pid_alive_and_exited_follow_a_child_to_its_end() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert _proc.pid_alive(child.pid)
        assert not _proc.exited(child.pid, child)
        # Popen returns once exec has begun; the kernel sets the new image's arguments a moment
        # later (until then /proc/<pid>/cmdline reads empty), so wait for them.
        name = Path(sys.executable).name
        _proc.wait_for(lambda: name in _proc.cmdline(child.pid), 10, "the child's command line")
    finally:
        _proc.terminate(child.pid, signal.SIGTERM, timeout=10, proc=child)
    assert child.returncode is not None
    assert _proc.exited(child.pid, child)
    assert not _proc.pid_alive(child.pid)


def test_pid_alive_while_main_thread_ended_but_others_run() -> None:
    # The JVM's shape at shutdown: a zombie thread-group leader while a worker thread runs.
    code = (
        "import threading, time, os, ctypes\n"
        "threading.Thread(target=lambda: (time.sleep(1), os._exit(0))).start()\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    stat = Path(f"/proc/{child.pid}/stat")
    _proc.wait_for(lambda: stat.read_text().rpartition(")")[2].split()[0] == "Z", 5, "leader exit")
    try:
        assert _proc.pid_alive(child.pid)
    finally:
        assert child.wait(10) == 0
    assert not _proc.pid_alive(child.pid)


def test_kill_group_takes_children_that_left_the_group() -> None:
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    _proc.wait_for(lambda: bool(_proc.children(parent.pid)), 10, "grandchild to start")
    [kid] = _proc.children(parent.pid)
    _proc.kill_group(parent.pid, parent)
    assert parent.returncode == -9
    _proc.wait_for(lambda: not _proc.pid_alive(kid), 10, "grandchild to die")


def test_wait_for_names_what_timed_out() -> None:
    with pytest.raises(TimeoutError, match="the moon"):
        _proc.wait_for(lambda: False, 0.1, "the moon")


def test_api_versions_probe_is_false_without_a_kafka_broker() -> None:
    assert not api_versions_ok("127.0.0.1", _proc.free_port(), timeout=0.5)
    # Something listening that never answers is not a broker either.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        closer = threading.Timer(0.3, listener.close)
        closer.start()
        assert not api_versions_ok("127.0.0.1", port, timeout=2.0)
        closer.join()


def test_export_line_is_shell_safe() -> None:
    info = SandboxInfo(
        state_dir=Path("/s"),
        dsn="host=127.0.0.1 port=5 user=postgres dbname=postgres",
        bootstrap_servers="127.0.0.1:9",
        postgres_port=5,
        postgres_pid=None,
        postgres_datadir=Path("/s/pg"),
        kafka_port=9,
        kafka_controller_port=10,
        kafka_pid=None,
        kafka_dir=Path("/s/k"),
    )
    words = shlex.split(info.export_line())
    assert words == [
        "export",
        "CDC_OUTBOX_DSN=host=127.0.0.1 port=5 user=postgres dbname=postgres",
        "CDC_OUTBOX_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:9",
    ]
    with_registry = dataclasses.replace(info, registry_url="http://127.0.0.1:8/apis/ccompat/v7")
    assert shlex.split(with_registry.export_line())[-1] == (
        "CDC_OUTBOX_SCHEMA_REGISTRY__URL=http://127.0.0.1:8/apis/ccompat/v7"
    )
    assert not info.running


def test_pom_binds_slf4j_1_to_log4j2() -> None:
    # Kafka 4.1 logs through slf4j 1.7: the slf4j2 binding would leave the broker silent.
    assert "<artifactId>log4j-slf4j-impl</artifactId>" in _POM
    assert "log4j-slf4j2-impl" not in _POM
