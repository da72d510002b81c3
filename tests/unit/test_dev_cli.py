"""In a dev checkout the harness commands exist in both CLIs, whichever is imported first."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cdc_outbox.cli import app


def test_runtime_cli_registers_dev_commands_in_a_checkout() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "demo" in result.output and "sandbox" in result.output
    sandbox = CliRunner().invoke(app, ["sandbox", "--help"])
    assert sandbox.exit_code == 0 and "status" in sandbox.output


@pytest.mark.parametrize(
    "module", ["cdc_outbox_dev", "cdc_outbox"], ids=["python-m-dev", "python-m-runtime"]
)
def test_python_m_lists_dev_commands(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout and "sandbox" in result.stdout
