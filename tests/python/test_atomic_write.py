"""The one atomic writer (``riftco._native.write_file_atomic``) that ``training_metadata.json``
shares with the model files: whole files only, mode 0644, no temporaries left behind (also after
a writer was killed; the SIGKILL test is in ``test_files.py``), special files never replaced."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import riftco
from riftco.training import run_folder as stages
from riftco._native import write_file_atomic


def temporaries(folder: Path) -> list[str]:
    """Temporary files of any writer: ours (``.{name}.tmp.{pid}.{n}``) and ``tempfile``'s."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and "tmp" in p.name)


def test_metadata_is_written_whole_with_mode_0644_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / stages.METADATA_FILE
    stages.write_json_atomic(path, {"step": 1, "loss": 2.5})
    assert json.loads(path.read_text()) == {"loss": 2.5, "step": 1}
    assert stat.S_IMODE(path.stat().st_mode) == stages.METADATA_FILE_MODE
    stages.write_json_atomic(path, {"step": 2})
    assert json.loads(path.read_text()) == {"step": 2}
    assert temporaries(tmp_path) == []


def test_a_dead_writers_temporary_is_removed_by_the_next_write(tmp_path: Path) -> None:
    """A writer killed between creating its temporary and renaming it leaves the temporary; the
    next write of the same file removes it (the former Python writer, ``tempfile.mkstemp``,
    left such files forever)."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(child.stdout)
    stale = tmp_path / f".{stages.METADATA_FILE}.tmp.{dead_pid}.0"
    stale.write_bytes(b'{"half": ')
    other = tmp_path / f".other.json.tmp.{dead_pid}.0"
    other.write_bytes(b"not ours to remove")
    stages.write_json_atomic(tmp_path / stages.METADATA_FILE, {"step": 3})
    assert not stale.exists()
    assert other.exists(), "only temporaries of the file being written are removed"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing"):
        write_file_atomic(tmp_path / "missing" / "x.json", b"{}")
    folder = tmp_path / "a-folder.json"
    folder.mkdir()
    with pytest.raises(OSError, match="a-folder.json"):
        write_file_atomic(folder, b"{}")
    assert folder.is_dir() and temporaries(tmp_path) == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo (Unix)")
def test_a_fifo_at_the_destination_is_refused_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / stages.METADATA_FILE
    os.mkfifo(fifo)
    with pytest.raises(riftco.ModelStateError, match="FIFO"):
        stages.write_json_atomic(fifo, {"step": 1})
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert temporaries(tmp_path) == []
