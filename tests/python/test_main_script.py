"""``scripts/main.sh`` run from another folder: the user's relative paths (``--data``,
``--out``, the default ``runs/pretrain``) are relative to that folder, not to the repository."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import riftco

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "scripts" / "main.sh"
TINY = [
    "--d-model", "32", "--n-heads", "2", "--n-layers", "2", "--d-ff", "64", "--max-seq-len", "32",
    "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "1",
    "--no-progress", "--no-plots", "--sample-tokens", "4",
]  # fmt: skip

pytestmark = pytest.mark.skipif(
    not (ROOT / ".venv" / "bin" / "python").exists(),
    reason="scripts/main.sh runs the repository's .venv/bin/python, which does not exist here",
)


def main_sh(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # RIFTCO_SKIP_SETUP: the tests run in a .venv that is set up already (a stale Rust input
    # would otherwise start a release build inside the test).
    env = dict(os.environ, RIFTCO_SKIP_SETUP="1")
    return subprocess.run(
        ["bash", str(MAIN), *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )


def test_relative_data_and_out_are_the_callers(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_bytes(bytes(riftco.default_corpus().tokens[:5_000]))
    name = f"myrun-{os.getpid()}"
    r = main_sh("--data", "notes.txt", "--out", name, *TINY, cwd=tmp_path)
    # Was: "data path 'notes.txt' does not exist" (the script changed directory first).
    assert r.returncode == 0, r.stderr
    assert "does not exist" not in r.stderr
    assert (tmp_path / name / "model.safetensors").is_file()
    assert not (ROOT / name).exists(), "--out landed inside the repository"
    meta = json.loads((tmp_path / name / "training_metadata.json").read_text())
    assert meta["corpus"]["description"] == "notes.txt"


def test_default_output_is_under_the_callers_folder(tmp_path: Path) -> None:
    r = main_sh(*TINY, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "runs" / "pretrain" / "model.safetensors").is_file()


def test_comments_name_files_that_exist() -> None:
    # The scripts' comments once described examples/pretrain.py as not existing yet.
    text = MAIN.read_text()
    assert "does not exist yet" not in text and "smoke.py" not in text
    assert (ROOT / "examples" / "pretrain.py").is_file()
