"""``cdc-outbox config show`` through the real CLI: effective values, secrets redacted, and
the source of each (default / file / env / flag)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.helpers import run_cli


def test_config_show_names_sources_and_hides_secrets(tmp_path: Path) -> None:
    toml = tmp_path / "relay.toml"
    toml.write_text(
        'slot_name = "from_file"\n[polling]\nbatch_size = 7\n'
        '[kafka.config]\n"sasl.password" = "file-Secret-1"\n'
    )
    result = run_cli(
        "--config",
        str(toml),
        "config",
        "show",
        "--json",
        "--table",
        "from_flag",
        dsn="host=127.0.0.1 password=pg-Secret-2",
        CDC_OUTBOX_POLLING__LEASE_S="9",
        CDC_OUTBOX_KAFKA__CONFIG__SASL__USERNAME="alice",
    )
    assert result.returncode == 0, result.stderr
    assert "Secret" not in result.stdout
    shown = json.loads(result.stdout)
    assert shown["config_file"] == str(toml)
    settings = shown["settings"]
    assert settings["slot_name"] == {"value": "from_file", "source": "file"}
    assert settings["polling.batch_size"] == {"value": 7, "source": "file"}
    assert settings["polling.lease_s"] == {"value": 9.0, "source": "env"}
    assert settings["outbox_table"] == {"value": "from_flag", "source": "flag"}
    assert settings["kafka.config.sasl.password"] == {"value": "***", "source": "file"}
    assert settings["kafka.config.sasl.username"] == {"value": "alice", "source": "env"}
    assert settings["dsn"]["source"] == "env" and "***" in settings["dsn"]["value"]
    assert settings["mode"] == {"value": "auto", "source": "default"}
    assert settings["metrics_port"] == {"value": 9077, "source": "default"}
    table = run_cli("config", "show", dsn="host=127.0.0.1 password=pg-Secret-2")
    assert table.returncode == 0, table.stderr
    assert "Secret" not in table.stdout and "metrics_port" in table.stdout
