"""What a new user sees from the ``riftco`` command: help without reStructuredText markup, and no
``error:`` line that is not riftco's (Mesa's Vulkan driver complains about an unset
``XDG_RUNTIME_DIR`` on headless machines unless riftco gives it a private runtime folder)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from riftco.cli import plain_text
from riftco.commands import SUBCOMMANDS


@pytest.mark.parametrize("command", [[], *[[name] for name in SUBCOMMANDS]], ids=repr)
def test_help_is_plain_text(command: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "riftco", *command, "--help"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert "usage:" in out
    for markup in ("``", ":func:`", ":class:`", ":mod:`"):
        assert markup not in out, f"{command}: {markup!r} in --help"


def test_plain_text_drops_literals_and_roles() -> None:
    assert plain_text("run ``pretrain`` (:func:`riftco.run_pretraining`, :mod:`~riftco.cli`)") == (
        "run pretrain (riftco.run_pretraining, riftco.cli)"
    )


def test_info_prints_no_foreign_error_lines_without_xdg_runtime_dir() -> None:
    # On a machine with Mesa's software Vulkan (CI installs it) the driver printed four
    # "error: XDG_RUNTIME_DIR is invalid or not set in the environment." lines here.
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    result = subprocess.run(
        [sys.executable, "-m", "riftco", "info"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "device vulkan:" in result.stdout
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [], errors
