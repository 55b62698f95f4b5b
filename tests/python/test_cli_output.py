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
    columns = 72
    out = subprocess.run(
        [sys.executable, "-m", "riftco", *command, "--help"],
        capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "COLUMNS": str(columns)},
    ).stdout
    assert "usage:" in out
    for markup in ("``", "`", ":func:", ":class:", ":mod:"):
        assert markup not in out, f"{command}: {markup!r} in --help"
    # The descriptions' prose is re-wrapped to the terminal (argparse uses COLUMNS - 2), not
    # kept at the docstrings' line breaks; only indented lines (examples, flags) may run longer.
    long_prose = [
        line for line in out.splitlines() if line[:1].strip() and len(line) > columns - 2
    ]
    assert long_prose == [], long_prose


def test_help_keeps_example_lines_as_written() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "riftco", "pretrain", "--help"],
        capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "COLUMNS": "60"},
    ).stdout
    # Indented lines are kept as written, however narrow the terminal.
    example = "  riftco pretrain --device gpu --out runs/pretrain-gpu        # on the best GPU"
    assert any(line.startswith(example) for line in out.splitlines()), out


def test_plain_text_drops_literals_and_roles() -> None:
    assert plain_text("run ``pretrain`` (:func:`riftco.run_pretraining`, :mod:`~riftco.cli`)") == (
        "run pretrain (riftco.run_pretraining, riftco.cli)"
    )


@pytest.mark.parametrize("xdg_runtime_dir", [None, "", "."], ids=["unset", "empty", "relative"])
def test_info_prints_no_foreign_error_lines_without_xdg_runtime_dir(
    xdg_runtime_dir: str | None,
) -> None:
    # On a machine with Mesa's software Vulkan (CI installs it) the driver printed four
    # "error: XDG_RUNTIME_DIR is invalid or not set in the environment." lines here; libwayland
    # rejects a relative path (an existing folder) as it rejects none.
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    if xdg_runtime_dir is not None:
        env["XDG_RUNTIME_DIR"] = xdg_runtime_dir
    result = subprocess.run(
        [sys.executable, "-m", "riftco", "info"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "device vulkan:" in result.stdout
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [], errors
