"""The messages and behaviours a new user met (issue 18), each replaced by a better one: the
quoted old texts must not come back, the new ones name the value and the next step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import riftco

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = ROOT / "examples" / "pretrain.py"
POST_TRAIN = ROOT / "examples" / "post_train.py"
TINY = [
    "--d-model", "32", "--n-heads", "2", "--n-layers", "2", "--d-ff", "64", "--max-seq-len", "32",
    "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "1", "--no-progress", "--no-plots",
]  # fmt: skip


def run(
    *args: str | Path, cwd: Path = ROOT, python: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(python or [sys.executable]), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_bytes(bytes(riftco.default_corpus().tokens[:20_000]))
    return path


def test_python_m_riftco_exists() -> None:
    r = run("-m", "riftco", "info")
    assert r.returncode == 0, r.stderr
    assert "No module named riftco.__main__" not in r.stderr


def test_sample_length_does_not_follow_a_huge_max_seq_len(tmp_path: Path, text_file: Path) -> None:
    # Was: the sample filled max_seq_len (100,000 bytes, minutes of decoding after the save).
    args: list[str | Path] = [*TINY, "--steps", "1", "--data", text_file, "--out", tmp_path]
    r = run("-m", "riftco", "pretrain", *args, "--max-seq-len", "100000", "--seq-len", "16")
    assert r.returncode == 0, r.stderr
    header, sample = r.stdout.split("--- sample", 1)
    assert "256 bytes" in sample.splitlines()[0]
    text = sample.split("---\n", 1)[1]
    # Prompt "def " plus 256 bytes, printed as UTF-8 (a byte may become one U+FFFD).
    assert text.startswith("def ") and 4 + 1 <= len(text.rstrip("\n")) <= 4 + 256


def test_tiny_file_counts_agree_and_name_seq_len(tmp_path: Path) -> None:
    data = tmp_path / "notes.txt"
    data.write_bytes(b"hello world\n")  # 12 bytes
    r = run(PRETRAIN, *TINY, "--steps", "1", "--data", data, "--out", tmp_path / "o")
    line = error_line(r)
    # Was: "corpus: 47 bytes" (a header line added to the user's file) then "the text has 45
    # bytes; seq_len 128 needs at least 129", with nothing suggesting --seq-len.
    assert "47 bytes" not in r.stderr and "the text has" not in r.stderr
    assert "the corpus has 12 bytes" in line and "--seq-len 16" in line and "--data" in line
    assert not (tmp_path / "o").exists()


def test_small_file_suggests_the_largest_seq_len(tmp_path: Path) -> None:
    data = tmp_path / "notes.txt"
    data.write_bytes(b"x" * 60)  # 57 for training, 3 held out
    r = run(PRETRAIN, *TINY, "--steps", "1", "--seq-len", "60", "--max-seq-len", "64",
            "--data", data, "--out", tmp_path / "o")  # fmt: skip
    line = error_line(r)
    assert "57 for training and 3 held out" in line and "--seq-len of at most 56" in line


def test_corpus_line_counts_the_file_bytes(tmp_path: Path, text_file: Path) -> None:
    r = run(PRETRAIN, *TINY, "--steps", "1", "--data", text_file, "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    size = text_file.stat().st_size
    train, val = riftco.load_corpus(text_file).split(0.05)
    assert f"corpus: {size:,} bytes in 1 part" in r.stderr
    assert f"{train.shape[0]:,} for training, {val.shape[0]:,} held out" in r.stderr
    meta = json.loads((tmp_path / "training_metadata.json").read_text())
    assert meta["corpus"]["n_bytes"] == size  # no header lines in a user's file


def test_user_files_are_read_byte_for_byte(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"first")
    (tmp_path / "b.txt").write_bytes(b"second\n")
    corpus = riftco.load_corpus([tmp_path / "a.txt", tmp_path / "b.txt"])
    assert bytes(corpus.tokens) == b"first\nsecond\n"  # a newline only where one was missing
    # The default corpus keeps its documented header lines.
    assert bytes(riftco.default_corpus().tokens[:7]) == b"# ==== "


def test_post_train_without_pretraining_says_to_pretrain(tmp_path: Path) -> None:
    # Was: "no model state at 'runs/pretrain'" without the next step.
    line = error_line(run(POST_TRAIN, "--steps", "1", cwd=tmp_path))
    assert "run `riftco pretrain`" in line and "--model" in line
    line = error_line(run("-m", "riftco", "post-train", "--steps", "1", cwd=tmp_path))
    assert "run `riftco pretrain`" in line


@pytest.mark.parametrize("script", [PRETRAIN, POST_TRAIN], ids=["pretrain", "post_train"])
def test_example_without_the_package_says_how_to_set_up(script: Path) -> None:
    # `python -S` has no site-packages: riftco (and numpy) cannot be imported, as with a system
    # python3 outside the repository's .venv. Was: a bare ModuleNotFoundError traceback.
    line = error_line(run(script, "--help", python=[sys.executable, "-S"]))
    assert "No module named" in line and "bash scripts/setup.sh" in line
    assert f".venv/bin/python examples/{script.name}" in line


def test_another_configuration_is_not_overwritten(tmp_path: Path, text_file: Path) -> None:
    out = tmp_path / "run"
    base: list[str | Path] = [*TINY, "--data", text_file, "--out", out]
    assert run(PRETRAIN, *base, "--steps", "2").returncode == 0
    state = (out / "model.safetensors").read_bytes()
    line = error_line(run(PRETRAIN, *base, "--steps", "3"))
    assert "another configuration" in line and "steps 2 -> 3" in line and "--overwrite" in line
    assert (out / "model.safetensors").read_bytes() == state
    # The same configuration again replaces the run; --overwrite replaces another one.
    assert run(PRETRAIN, *base, "--steps", "2", "--log-every", "1").returncode == 0
    r = run(PRETRAIN, *base, "--steps", "3", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "training_metadata.json").read_text())["steps_completed"] == 3


def test_model_files_without_metadata_are_not_overwritten(tmp_path: Path, text_file: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"someone's model")
    line = error_line(run(PRETRAIN, *TINY, "--steps", "1", "--data", text_file, "--out", tmp_path))
    assert "model.safetensors" in line and "--overwrite" in line
    assert (tmp_path / "model.safetensors").read_bytes() == b"someone's model"


def test_seq_len_errors_say_what_fits(tmp_path: Path) -> None:
    line = error_line(run(PRETRAIN, *TINY, "--seq-len", "64", "--out", tmp_path / "o"))
    assert "--seq-len of at most 32" in line


def test_sample_tokens_error_says_what_fits(tmp_path: Path) -> None:
    line = error_line(run(PRETRAIN, *TINY, "--sample-tokens", "40", "--out", tmp_path / "o"))
    assert "pass --sample-tokens 29 or less" in line
