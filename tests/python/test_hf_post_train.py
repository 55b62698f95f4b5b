"""``examples/post_train.py --model FOLDER`` on a plain Hugging Face model folder (no riftco
extras): byte tokens without a ``tokenizer.json``, the folder's tokenizer through the
``tokenizers`` package with one, and a clear error when that package is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import riftco

ROOT = Path(__file__).resolve().parents[2]
POST_TRAIN = ROOT / "examples" / "post_train.py"
TEXT = "the cat sat on the mat and the dog sat on the log " * 40
TRAIN = ["--steps", "2", "--batch-size", "2", "--seq-len", "8", "--warmup-steps", "1",
         "--no-progress", "--sample-tokens", "4", "--prompt", "the "]


def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(POST_TRAIN), *map(str, args)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )


def hf_folder(tmp_path: Path, vocab_size: int) -> Path:
    """A plain HF folder: riftco's config.json without its riftco key, the weights in bf16
    under the HF file name, no training metadata."""
    folder = tmp_path / "hf"
    folder.mkdir()
    m = riftco.DecoderOnlyTransformer(
        riftco.TransformerConfig(vocab_size, 32, 2, 1, 48, 16, seed=1, eos_token_ids=[0])
    )
    m.save(folder / "model.safetensors", dtype="bfloat16")
    hf = json.loads((folder / "config.json").read_text())
    hf.pop("riftco")
    (folder / "config.json").write_text(json.dumps(hf))
    raw = (folder / "model.safetensors").read_bytes()
    # Drop the riftco metadata: rewrite the file without it (header only changes).
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__")
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (folder / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])
    return folder


def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    return path


def test_byte_vocabulary_folder_post_trains(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path, 256)
    r = run("--model", folder, "--data", data_file(tmp_path), "--out", tmp_path / "out", *TRAIN)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()
    assert "bytes in" in r.stderr


def test_tokenizer_json_folder_post_trains_on_its_tokens(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip(
        "tokenizers", reason="tokenizers is not installed: the tokenizer.json path is skipped"
    )
    words = sorted(set(TEXT.split()))
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    folder = hf_folder(tmp_path, 16)  # below 256: byte tokens could not be used
    tok.save(str(folder / "tokenizer.json"))
    r = run("--model", folder, "--data", data_file(tmp_path), "--out", tmp_path / "out", *TRAIN)
    assert r.returncode == 0, r.stderr
    assert "tokens in" in r.stderr
    meta = json.loads((tmp_path / "out" / "training_metadata.json").read_text())
    assert meta["final_loss"] < 10


def test_missing_tokenizers_package_is_named(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path, 16)
    (folder / "tokenizer.json").write_text("{}")
    blocker = tmp_path / "block"
    (blocker / "tokenizers").mkdir(parents=True)
    (blocker / "tokenizers" / "__init__.py").write_text("raise ImportError('blocked')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    r = run("--model", folder, "--data", data_file(tmp_path), "--out", tmp_path / "out", *TRAIN, env=env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "pip install tokenizers" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()
