"""The pure parts of the physical-standby harness (cdc_outbox_dev/sandbox/standby.py)."""

from __future__ import annotations

import os

import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc_outbox_dev.sandbox import standby as sb


class _Server:
    def __init__(self, port: int) -> None:
        self.port = port


def test_multi_host_dsn_lists_every_server_and_wants_the_read_write_one() -> None:
    dsn = sb.multi_host_dsn([_Server(5001), _Server(5002)], "app", connect_timeout="3")  # type: ignore[list-item]
    assert conninfo_to_dict(dsn) == {
        "host": "127.0.0.1,127.0.0.1",
        "port": "5001,5002",
        "user": "postgres",
        "dbname": "app",
        "target_session_attrs": "read-write",
        "connect_timeout": "3",
    }


def test_standby_settings_name_the_primary_the_application_and_the_slot() -> None:
    settings = sb.standby_settings(5001, "standby1", slot="standby1_slot")
    assert conninfo_to_dict(settings["primary_conninfo"]) == {
        "host": "127.0.0.1",
        "port": "5001",
        "user": "postgres",
        "dbname": "postgres",  # PostgreSQL 17 slot synchronization needs a dbname
        "application_name": "standby1",
    }
    assert settings["primary_slot_name"] == "standby1_slot"
    assert settings["hot_standby"] == "on"
    assert "primary_slot_name" not in sb.standby_settings(5001, "standby1")


def test_the_copy_leaves_out_runtime_files_and_the_contents_of_wal_and_slot_dirs() -> None:
    root = "/data"
    top = ["base", "global", "pg_wal", "pg_replslot", "postmaster.pid", "server.log",
           "postgresql.conf", "PG_VERSION"]  # fmt: skip
    assert sb.copy_ignored(root, top, root) == {"postmaster.pid", "server.log"}
    wal = ["000000010000000000000001", "archive_status"]
    assert sb.copy_ignored(os.path.join(root, "pg_wal"), wal, root) == set(wal)
    assert sb.copy_ignored(os.path.join(root, "pg_replslot"), ["s"], root) == {"s"}
    assert sb.copy_ignored(os.path.join(root, "base", "1"), ["112"], root) == set()


def test_timeline_comes_from_the_wal_file_name() -> None:
    assert sb.timeline_of_walfile("000000020000000000000003") == 2
    assert sb.timeline_of_walfile("0000000A0000000100000003") == 10
    with pytest.raises(ValueError, match="not a WAL segment"):
        sb.timeline_of_walfile("00000002.history")
