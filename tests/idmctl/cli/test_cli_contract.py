"""The CLI stays fast: the control plane never imports the heavy stack at import time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ground.contract import ENV_HOME

HEAVY = ["torch", "mlflow", "lightning", "lightning_fabric", "diffusers", "accelerate", "robosuite"]

PROBE = """
import sys, json
from typer.testing import CliRunner
from idmctl.cli.app import app
result = CliRunner().invoke(app, {args!r})
heavy = sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})
print(json.dumps({{"exit": result.exit_code, "heavy": heavy}}))
"""


@pytest.mark.parametrize("args", [["--help"], ["exp", "list"], ["exp", "show", "latent_c_n4"], ["decide", "--help"],
                                  ["decide", "latent_a_v1", "--goal", "eef_mm_5ep <= 125"]])
def test_light_commands_import_no_heavy_module(args: list[str], tmp_path):
    code = PROBE.format(args=args, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={ENV_HOME: str(tmp_path), "PATH": "/usr/bin:/bin"})
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["exit"] == 0
    assert report["heavy"] == []


def test_help_lists_the_command_groups(cli):
    result = cli("--help")
    assert result.exit_code == 0
    assert "exp" in result.output and "quickstart" in result.output and "decide" in result.output
