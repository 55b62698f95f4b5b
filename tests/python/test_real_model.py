"""The real trained model end to end through the command line: SmolLM2-135M-Instruct as a GGUF
(llama.cpp's Q4_1), LoRA post-trained on the built-in chat rows with its own tokenizer and chat
template, then talked to through the run folder. Skips, saying how to fetch the file, without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from real_models import SMOLLM2, SMOLLM2_MISSING

pytest.importorskip("tokenizers", reason="tokenizers is not installed: GGUF tokenizers need it")
pytestmark = pytest.mark.skipif(not SMOLLM2.is_file(), reason=SMOLLM2_MISSING)

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
"""The default system turn of the GGUF's own ChatML template (not in riftco's default one)."""


def riftco_cmd(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riftco", *map(str, args)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )


def test_lora_post_training_a_gguf_uses_its_tokenizer_and_template(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = riftco_cmd(
        "post-train", "--model", SMOLLM2, "--data-format", "chat", "--steps", "3",
        "--batch-size", "2", "--seq-len", "128", "--lr", "1e-3", "--out", out, "--no-plots",
        "--no-progress", "--max-new-tokens", "12", "--temperature", "0",
    )
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "training_metadata.json").read_text())
    assert meta["base_model"] == str(SMOLLM2)
    assert f"the tokenizer.chat_template of {SMOLLM2}" in meta["corpus"]["description"]
    # Token counts, not bytes: 666 rows of about 55 tokens each through the BPE vocabulary
    # (as bytes the same rows are about 4x as many).
    assert meta["corpus"]["tokens"] < 60_000, meta["corpus"]
    # A trained model starts far below the uniform loss over its 49,152 tokens (ln 49152 = 10.8
    # per token would be random weights or a wrong tokenizer), and LoRA moves it down.
    before, after = meta["validation_loss_before"], meta["validation_loss_after"]
    assert before < 5.0 < meta["uniform_baseline_loss"], meta
    assert after < before, (before, after)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {s["when"] for s in samples} == {"before", "after"}
    assert all(SYSTEM in s["prompt"] for s in samples), samples[0]
    # English words from the real vocabulary, not byte soup.
    assert all(s["generated"].isascii() and " " in s["generated"] for s in samples), samples

    chat = riftco_cmd(
        "generate", "--model", out, "--chat", "What does inspect.isasyncgen() do?",
        "--temperature", "0", "--max-new-tokens", "24",
    )
    assert chat.returncode == 0, chat.stderr
    assert "LoRA adapter" in chat.stderr and "tokens" in chat.stderr, chat.stderr
    words = chat.stdout.split()
    assert len(words) >= 3 and chat.stdout.isascii(), chat.stdout


def test_the_python_example_runs(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "real_model_lora.py"), "--steps", "2",
         "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert "answer-token validation loss" in r.stdout, r.stdout
    # The unrelated question, before 2 small steps: the base model's answer.
    assert "before: The capital of France is Paris." in r.stdout, r.stdout
