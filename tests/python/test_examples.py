"""The command-line examples and the Python bench, run as subprocesses with tiny settings."""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import riftco

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = ROOT / "examples" / "pretrain.py"
POST_TRAIN = ROOT / "examples" / "post_train.py"
BENCH = ROOT / "benches" / "train_step.py"
TINY_MODEL = [
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--n-layers",
    "2",
    "--d-ff",
    "64",
    "--max-seq-len",
    "32",
]
TINY_TRAIN = [
    "--steps",
    "3",
    "--batch-size",
    "2",
    "--seq-len",
    "16",
    "--warmup-steps",
    "1",
    "--no-progress",
]


def run(
    script: Path, *args: str | Path, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_bytes(bytes(riftco.default_corpus().tokens[:30_000]))
    return path


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pretrain")
    r = run(PRETRAIN, *TINY_MODEL, *TINY_TRAIN, "--out", out, "--activation-checkpointing", "block")
    assert r.returncode == 0, r.stderr
    return out


def test_pretrain_default_corpus(pretrained: Path) -> None:
    meta = json.loads((pretrained / "training_metadata.json").read_text())
    assert meta["activation_checkpointing"] == "block" and meta["complete"]
    assert "stdlib" in meta["corpus"]["description"]
    assert (pretrained / "model.safetensors").is_file() and (pretrained / "config.json").is_file()


def test_pretrain_on_given_data_prints_sample(tmp_path: Path, text_file: Path) -> None:
    r = run(
        PRETRAIN,
        *TINY_MODEL,
        *TINY_TRAIN,
        "--data",
        text_file,
        "--out",
        tmp_path,
        "--attention",
        "materialized",
    )
    assert r.returncode == 0, r.stderr
    assert "final loss" in r.stdout and "--- sample" in r.stdout
    # The summary is printed once (stdout), not also as the stage's log line on stderr, and the
    # saved line names every file of the Hugging Face folder.
    assert "final loss" not in r.stderr, r.stderr
    saved = [line for line in r.stdout.splitlines() if line.startswith("saved ")]
    assert len(saved) == 1 and all(
        name in saved[0] for name in ("model.safetensors", "config.json", "training_metadata.json")
    ), saved
    meta = json.loads((tmp_path / "training_metadata.json").read_text())
    assert meta["attention"] == "materialized" and str(text_file) in meta["corpus"]["description"]


@pytest.mark.parametrize("method", ["lora", "full"])
def test_post_train(pretrained: Path, tmp_path: Path, text_file: Path, method: str) -> None:
    r = run(
        POST_TRAIN,
        "--model",
        pretrained,
        "--fine-tuning-method",
        method,
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--lora-rank",
        "2",
        "--no-progress",
        "--sample-tokens",
        "8",
        "--out",
        tmp_path,
        "--activation-checkpointing",
        "block",
    )
    assert r.returncode == 0, r.stderr
    assert "sample before" in r.stdout and "sample after" in r.stdout
    saved = tmp_path / (
        "adapter/adapter_model.safetensors" if method == "lora" else "model.safetensors"
    )
    assert saved.is_file()
    meta = json.loads((tmp_path / "training_metadata.json").read_text())
    assert meta["fine_tuning_method"] == method and meta["activation_checkpointing"] == "block"
    assert "topics.py" in meta["corpus"]["description"]


def _assert_clean_failure(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_pretrain_missing_data_path(tmp_path: Path) -> None:
    r = run(
        PRETRAIN, *TINY_MODEL, *TINY_TRAIN, "--data", tmp_path / "nope.txt", "--out", tmp_path / "o"
    )
    _assert_clean_failure(r, "nope.txt", "does not exist")


def test_pretrain_empty_corpus(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    r = run(
        PRETRAIN,
        *TINY_MODEL,
        *TINY_TRAIN,
        "--data",
        tmp_path / "empty.txt",
        "--out",
        tmp_path / "o",
    )
    _assert_clean_failure(r, "empty")


def test_pretrain_seq_len_above_max(tmp_path: Path) -> None:
    r = run(PRETRAIN, *TINY_MODEL, *TINY_TRAIN, "--seq-len", "64", "--out", tmp_path)
    _assert_clean_failure(r, "--seq-len 64", "--max-seq-len 32")


def test_pretrain_unwritable_output(tmp_path: Path, text_file: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    r = run(PRETRAIN, *TINY_MODEL, *TINY_TRAIN, "--data", text_file, "--out", blocker / "out")
    _assert_clean_failure(r, "cannot write to output folder")


def test_pretrain_bad_number(tmp_path: Path) -> None:
    r = run(PRETRAIN, *TINY_MODEL, *TINY_TRAIN, "--lr", "-1", "--out", tmp_path)
    _assert_clean_failure(r, "lr", "-1")


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--seed", "-1"], ["argument --seed", "got -1"]),
        (["--seed", str(2**64)], ["argument --seed", "at most 18446744073709551615"]),
        (["--temperature", "nan"], ["argument --temperature", "finite and >= 0", "nan"]),
        (["--temperature", "-1"], ["argument --temperature", "got -1"]),
        (["--top-k", "0"], ["argument --top-k", "must be >= 1; got 0"]),
        (["--top-k", "1.5"], ["argument --top-k", "'1.5'"]),
        (["--prompt="], ["--prompt", "at least one byte"]),
        (["--sample-tokens", "40"], ["--sample-tokens", "43 positions", "max_seq_len is 32"]),
        (["--sample-tokens", "-1"], ["argument --max-new-tokens/--sample-tokens", "got -1"]),
        (["--steps", "abc"], ["argument --steps", "'abc'"]),
        (["--steps", "0"], ["argument --steps", "got 0"]),
        (["--d-model", "-3"], ["argument --d-model", "got -3"]),
        (["--warmup-steps", "-1"], ["argument --warmup-steps", "got -1"]),
        (["--lr", "nan"], ["lr", "nan"]),
        (["--weight-decay", "inf"], ["weight_decay", "inf"]),
    ],
)
def test_pretrain_rejects_bad_flags_before_training(
    tmp_path: Path, text_file: Path, flags: list[str], needles: list[str]
) -> None:
    out = tmp_path / "out"
    r = run(PRETRAIN, *TINY_MODEL, *TINY_TRAIN, "--data", text_file, "--out", out, *flags)
    _assert_clean_failure(r, *needles)
    assert not out.exists(), "the output folder was created: work started before validation"


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--seed", "-1"], ["argument --seed", "got -1"]),
        (["--temperature", "nan"], ["argument --temperature", "nan"]),
        (["--top-k", "0"], ["argument --top-k", "got 0"]),
        (["--prompt="], ["--prompt", "at least one byte"]),
        (["--sample-tokens", "40"], ["--sample-tokens", "max_seq_len is 32"]),
        (["--lora-rank", "0"], ["argument --lora-rank", "got 0"]),
        (["--lora-alpha", "nan"], ["lora_alpha", "nan"]),
        (["--steps", "abc"], ["argument --steps", "'abc'"]),
    ],
)
def test_post_train_rejects_bad_flags_before_training(
    pretrained: Path, tmp_path: Path, text_file: Path, flags: list[str], needles: list[str]
) -> None:
    out = tmp_path / "out"
    r = run(POST_TRAIN, "--model", pretrained, "--data", text_file, "--out", out, *flags)
    _assert_clean_failure(r, *needles)
    assert not out.exists(), "the output folder was created: work started before validation"


def test_prompt_flag_keeps_non_utf8_bytes(tmp_path: Path, text_file: Path) -> None:
    # A byte that is not UTF-8 on the command line reaches the model as that byte.
    prompt = os.fsdecode(b"a\xff")
    r = run(
        PRETRAIN,
        *TINY_MODEL,
        *TINY_TRAIN,
        "--data",
        text_file,
        "--out",
        tmp_path,
        "--prompt",
        prompt,
        "--sample-tokens",
        "3",
    )
    assert r.returncode == 0, r.stderr
    sample = r.stdout.split("--- sample", 1)[1].splitlines()[1]
    assert sample.startswith("a\ufffd"), sample


def test_post_train_missing_model(tmp_path: Path) -> None:
    r = run(POST_TRAIN, "--model", tmp_path / "nothing", "--out", tmp_path / "o")
    _assert_clean_failure(r, "no model state")


def test_post_train_seq_len_above_max(pretrained: Path, tmp_path: Path) -> None:
    r = run(POST_TRAIN, "--model", pretrained, "--seq-len", "64", "--out", tmp_path)
    _assert_clean_failure(r, "--seq-len 64", "max_seq_len 32")


MEMORY_LIMIT_BYTES = 4_000_000_000


def _child_setup(sigint: signal.Handlers) -> Callable[[], None]:
    """``preexec_fn`` for a training child: a memory limit, and SIGINT set to ``sigint``
    explicitly (a shell that starts the test command in the background, ``nohup ... &``, hands
    its children SIGINT ignored; the test must not depend on that)."""

    def setup() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
        signal.signal(signal.SIGINT, sigint)

    return setup


def _interrupt_training(
    out: Path, text_file: Path, sigint: signal.Handlers, gaps_s: list[float], delay_s: float
) -> tuple[int, str]:
    """Starts a long pretraining run, waits for its first save, then ``delay_s`` more, sends
    SIGINT, and one more SIGINT after each of ``gaps_s``; returns the exit code and stderr."""
    args = [
        sys.executable,
        str(PRETRAIN),
        *TINY_MODEL,
        "--steps",
        "1000000",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--save-every",
        "2",
        "--no-progress",
        "--data",
        str(text_file),
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=_child_setup(sigint),
    )
    meta_path = out / "training_metadata.json"
    deadline = time.monotonic() + 120
    try:
        while not meta_path.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no save within 120 s"
            time.sleep(0.02)
        time.sleep(delay_s)
        proc.send_signal(signal.SIGINT)
        for gap in gaps_s:
            time.sleep(gap)
            proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"still running 60 s after SIGINT: {err[-500:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def _assert_interrupted_cleanly(out: Path, returncode: int, err: str) -> None:
    assert returncode == 130, (returncode, err[-2000:])
    assert "Traceback" not in err and "interrupted" in err
    meta = json.loads((out / "training_metadata.json").read_text())
    assert meta["saved_step"] >= 2 and not meta["complete"]
    assert f"step {meta['saved_step']}" in err
    # Its checkpoint is there, and the message says how to continue.
    assert (out / "checkpoints" / f"step-{meta['saved_step']:08d}" / "trainer_state.json").is_file()
    assert "--resume" in err
    model = riftco.DecoderOnlyTransformer.load(str(out / "model.safetensors"))
    assert model.config.d_model == 32
    assert not [p for p in os.listdir(out) if p.endswith(".tmp") or ".tmp." in p]


def test_ctrl_c_leaves_last_save_intact(tmp_path: Path, text_file: Path) -> None:
    code, err = _interrupt_training(tmp_path, text_file, signal.SIG_DFL, [], 0.3)
    _assert_interrupted_cleanly(tmp_path, code, err)


def test_ctrl_c_when_sigint_was_inherited_ignored(tmp_path: Path, text_file: Path) -> None:
    # What `nohup bash scripts/test.sh &` does to every child: the run must still stop.
    code, err = _interrupt_training(tmp_path, text_file, signal.SIG_IGN, [], 0.3)
    _assert_interrupted_cleanly(tmp_path, code, err)


DOUBLE_CTRL_C_RUNS = 16


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "ignored"])
def test_double_ctrl_c_exits_130(
    tmp_path: Path, text_file: Path, inherited: signal.Handlers
) -> None:
    # A second Ctrl-C 10 ms after the first, at varied moments of a step or a save.
    for i in range(DOUBLE_CTRL_C_RUNS // 2):
        out = tmp_path / f"run{i}"
        code, err = _interrupt_training(out, text_file, inherited, [0.01], 0.05 + 0.017 * i)
        _assert_interrupted_cleanly(out, code, err)


def test_bench_quick_smoke() -> None:
    r = run(BENCH, "--quick", "--steps", "1")
    assert r.returncode == 0, r.stderr
    for kind in ("flash", "materialized"):
        assert kind in r.stdout
    if importlib.util.find_spec("torch") is None:
        assert "PyTorch not installed" in r.stdout
    else:
        assert "ours/torch" in r.stdout
