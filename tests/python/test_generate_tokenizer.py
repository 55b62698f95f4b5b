"""Generation through a model's tokenizer: ``riftco.generate(..., tokenizer=)`` (``str`` in,
``str`` out; ids in, ids out; stops at EOS / end of turn) against greedy decoding by full
forward passes (``model.logits``, no K/V cache), and ``riftco generate`` on a model folder with a
``tokenizer.json`` and on a GGUF tokenizer (plain and ``--chat``, streamed, counted in tokens,
one error line for what cannot run)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco
from real_models import SMOLLM2, SMOLLM2_MISSING
import riftco._native
from riftco.cli import UsageError
from riftco.commands import build_parser
from riftco.commands import generate as generate_command

pytest.importorskip("tokenizers", reason="tokenizers is not installed: pip install tokenizers")
pytest.importorskip("gguf", reason="the gguf package is not installed: pip install gguf")
pytest.importorskip("jinja2", reason="Jinja2 is not installed (pip install 'riftco[chat]')")

import tiny_tokenizers as tt  # noqa: E402 (after the skips: it imports tokenizers and gguf)

ROOT = Path(__file__).resolve().parents[2]
SMOLLM = SMOLLM2
MAX_SEQ_LEN = 96


@pytest.fixture(scope="module")
def reference() -> Any:
    return tt.reference_byte_level_bpe("gpt-2")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, reference: Any) -> Path:
    """A riftco model whose vocabulary is the tokenizer's, with its tokenizer.json,
    tokenizer_config.json (BOS, EOS, ChatML template)."""
    out = tmp_path_factory.mktemp("model")
    vocab_size = reference.get_vocab_size(with_added_tokens=True)
    config = riftco.TransformerConfig(
        vocab_size=vocab_size, d_model=32, n_heads=2, n_layers=2, d_ff=64,
        max_seq_len=MAX_SEQ_LEN, seed=11,
    )
    riftco.DecoderOnlyTransformer(config).save(out / "model.safetensors")
    reference.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": tt.CHATML}
    ))
    return out


def greedy_by_full_forward(
    model: riftco.DecoderOnlyTransformer, prompt: list[int], n: int, stop: set[int], vocab: int
) -> list[int]:
    """Greedy ids from a full forward pass over the whole sequence at each step (no K/V cache):
    the argmax of the last position's first ``vocab`` logits, before any id in ``stop``."""
    out: list[int] = []
    with riftco.no_grad():
        for _ in range(n):
            z = model.logits(np.array([prompt + out], dtype=np.int64)).numpy()[-1, :vocab]
            top2 = np.sort(z)[-2:]
            # The premise of comparing argmaxes: no near-tie the two paths could order apart.
            assert top2[1] - top2[0] > 1e-3, top2
            t = int(np.argmax(z))
            if t in stop:
                break
            out.append(t)
    return out


def test_str_prompt_gives_the_greedy_str_continuation(folder: Path) -> None:
    model = riftco.load_model(folder)
    tok = riftco.load_tokenizer(folder)
    for prompt in ("def greet(name):", "The quick brown", "日本語 🎉 "):
        ids = tok.encode(prompt)
        want = greedy_by_full_forward(model, ids, 10, set(tok.stop_token_ids), tok.vocab_size)
        text = riftco.generate(model, prompt, 10, temperature=0.0, tokenizer=tok)
        assert isinstance(text, str)
        full = tok.decode(ids + want)
        assert text == full[len(tok.decode(ids)) :], prompt
        # Token ids in, token ids out.
        assert riftco.generate(model, ids, 10, temperature=0.0, tokenizer=tok) == want
        assert riftco.generate(model, np.array(ids), 10, temperature=0.0, tokenizer=tok) == want


def test_generation_stops_before_the_end_of_turn_id(folder: Path, reference: Any) -> None:
    model = riftco.load_model(folder)
    tok = riftco.load_tokenizer(folder)
    ids = tok.encode("for i in range")
    free = riftco.generate_tokens(model, ids, 12, temperature=0.0, vocab_size=tok.vocab_size)
    free_ids = list(free)
    k = next(k for k in range(2, len(free_ids)) if free_ids[k] not in free_ids[:k])
    # The same vocabulary with that token as its EOS: generation stops before it.
    stopping = riftco.Tokenizer(
        reference, name="eos at k", vocab_size=tok.vocab_size, eos_token_id=free_ids[k]
    )
    assert free_ids[k] in stopping.stop_token_ids
    assert riftco.generate(model, ids, 12, temperature=0.0, tokenizer=stopping) == free_ids[:k]
    # Sampling: seeded, reproducible, and stopped by the same ids.
    a = riftco.generate(model, "x = ", 8, temperature=0.9, top_k=20, seed=3, tokenizer=tok)
    assert a == riftco.generate(model, "x = ", 8, temperature=0.9, top_k=20, seed=3, tokenizer=tok)


def test_byte_tokenizer_keeps_byte_generation(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
        vocab_size=256, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=32, seed=2
    ))
    tok = riftco.load_tokenizer(tmp_path)  # a folder without tokenizer.json: bytes
    plain = riftco.generate(model, "ab", 12, temperature=0.0)
    assert riftco.generate(model, b"ab", 12, temperature=0.0, tokenizer=tok) == plain
    assert riftco.generate(model, "ab", 12, temperature=0.0, tokenizer=tok) == plain.decode(
        "utf-8", errors="replace"
    )
    assert riftco.generate(model, [97, 98], 12, temperature=0.0, tokenizer=tok) == list(plain)


def test_bad_prompts_with_a_tokenizer(folder: Path) -> None:
    model = riftco.load_model(folder)
    tok = riftco.load_tokenizer(folder)
    with pytest.raises(TypeError, match="a bytes prompt is for byte-level models"):
        riftco.generate(model, b"abc", 3, tokenizer=tok)
    n = tok.vocab_size
    with pytest.raises(riftco.TokenError, match=rf"prompt token {n} at index 1 is outside .*{n}\)"):
        riftco.generate(model, [5, n], 3, tokenizer=tok)
    with pytest.raises(riftco.TokenError, match="at least one token"):
        riftco.generate(model, [], 3, tokenizer=tok)
    with pytest.raises(riftco.TokenError, match="max_seq_len is 96"):
        riftco.generate(model, "word " * 60, 3, tokenizer=tok)
    with pytest.raises(TypeError, match="must be a riftco.Tokenizer"):
        riftco.generate(model, "abc", 3, tokenizer="tok.json")  # type: ignore[call-overload]
    # Another model's tokenizer: ids above this model's vocabulary.
    small = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
        vocab_size=256, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=32
    ))
    with pytest.raises(riftco.TokenError, match="the tokenizer does not belong to the model"):
        riftco.generate(small, "the quick brown fox", 3, tokenizer=tok)


# -- riftco generate ------------------------------------------------------------------------


def riftco_cmd(*args: str | Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "riftco", *map(str, args)],
        capture_output=True, timeout=300, cwd=ROOT, input=stdin,
    )
    return subprocess.CompletedProcess(
        r.args, r.returncode, r.stdout.decode("utf-8"), r.stderr.decode("utf-8")
    )


def one_error_line(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_cli_continues_text_with_the_folders_tokenizer(folder: Path) -> None:
    model, tok = riftco.load_model(folder), riftco.load_tokenizer(folder)
    prompt = "def greet(name):"
    want = riftco.generate(model, prompt, 9, temperature=0.0, tokenizer=tok)
    for flag in ("--max-new-tokens", "--sample-tokens"):
        r = riftco_cmd("generate", "--model", folder, "--temperature", "0", flag, "9", prompt)
        assert r.returncode == 0, r.stderr
        assert r.stdout == prompt + want + "\n"
    n_prompt = len(tok.encode(prompt))
    assert f"{n_prompt} prompt tokens, up to 9 tokens to generate" in r.stderr
    assert "tokenizer.json" in r.stderr


def test_cli_chat_answers_through_the_template(folder: Path) -> None:
    model, tok = riftco.load_model(folder), riftco.load_tokenizer(folder)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True),
                     add_special_tokens=False)
    answer = tok.decode(riftco.generate(model, ids, 12, temperature=0.0, tokenizer=tok))
    r = riftco_cmd("generate", "--model", folder, "--chat", "--system", "Be brief.",
                   "--temperature", "0", "--max-new-tokens", "12", "Hi?")
    assert r.returncode == 0, r.stderr
    assert r.stdout == answer + "\n"
    assert f"{len(ids)} prompt tokens" in r.stderr


def test_cli_lora_run_uses_the_base_models_tokenizer(folder: Path, tmp_path: Path) -> None:
    model = riftco.load_model(folder)
    model.enable_lora(rank=2)
    run = tmp_path / "run"
    run.mkdir()
    model.save_lora(run / "adapter")
    (run / "training_metadata.json").write_text(
        json.dumps({"base_model": str(folder / "model.safetensors")})
    )
    tok = riftco.load_tokenizer(folder)
    prompt = "class Stack:"
    want = riftco.generate(model, prompt, 6, temperature=0.0, tokenizer=tok)
    places: list[list[str | Path]] = [
        ["--model", run], ["--model", run / "adapter", "--base-model", folder]
    ]
    for where in places:
        r = riftco_cmd("generate", *where, "--temperature", "0", "--max-new-tokens", "6", prompt)
        assert r.returncode == 0, r.stderr
        assert r.stdout == prompt + want + "\n"
        assert f"with {folder / 'tokenizer.json'}" in r.stderr and "LoRA adapter" in r.stderr


def test_cli_bad_input_is_one_error_line(folder: Path, tmp_path: Path) -> None:
    tok = riftco.load_tokenizer(folder)
    one_error_line(
        riftco_cmd("generate", "--model", folder, "word " * 60),
        f"the prompt is {len(tok.encode('word ' * 60))} tokens, more than the model's "
        "max_seq_len of 96: pass a shorter PROMPT",
    )
    n = len(tok.encode("hi there"))
    one_error_line(
        riftco_cmd("generate", "--model", folder, "--max-new-tokens", "200", "hi there"),
        f"pass --max-new-tokens {MAX_SEQ_LEN - n + 1} or less",
    )
    one_error_line(
        riftco_cmd("generate", "--model", folder, "-", stdin=b"caf\xe9!\n"),
        "the prompt is not UTF-8 text (invalid continuation byte at byte 3)",
    )
    # A tokenizer that cannot spell the prompt (no byte fallback, no unknown token, no "z").
    import tokenizers as tk

    small = tmp_path / "small"
    small.mkdir()
    riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
        vocab_size=4, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=16
    )).save(small / "model.safetensors")
    bpe = tk.Tokenizer(tk.models.BPE({"a": 0, "b": 1, "ab": 2, "Ġ": 3}, [("a", "b")]))
    bpe.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.save(str(small / "tokenizer.json"))
    one_error_line(riftco_cmd("generate", "--model", small, "ab z"), "cannot encode 'z'")


def test_cli_streams_a_gguf_tokenizers_answer(
    folder: Path, reference: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The GGUF's tokenizer (read through riftco._native.read_gguf_metadata, here the gguf
    # package's reader), on the folder's model (a stand-in for the GGUF's weights).
    gguf_path = tt.write_bpe_gguf(tmp_path / "tiny.gguf", reference, "gpt-2")
    monkeypatch.setattr(
        riftco._native, "read_gguf_metadata", lambda p: tt.gguf_metadata(Path(p)), raising=False
    )
    model = riftco.load_model(folder)
    monkeypatch.setattr(
        generate_command, "load_for_generation", lambda *a, **k: (model, str(gguf_path))
    )
    writes: list[str] = []

    class Recorder:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stdout", Recorder())
    args = build_parser().parse_args(
        ["generate", "--model", str(gguf_path), "--chat", "--temperature", "0",
         "--max-new-tokens", "10", "Hi?"]
    )
    generate_command.run(args)
    tok = riftco.load_tokenizer(gguf_path)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hi?"}], True),
                     add_special_tokens=False)
    new = riftco.generate(model, ids, 10, temperature=0.0, tokenizer=tok)
    assert "".join(writes) == tok.decode(new) + "\n"
    # Written token by token as the text completes (never a piece cut inside a character),
    # then the newline.
    pieces = writes[:-1]
    assert 1 < len(pieces) <= len(new) and writes[-1] == "\n"
    assert not any(p.endswith("\ufffd") for p in pieces[:-1])


def test_cli_gguf_without_reader_is_one_error(
    reference: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf_path = tt.write_bpe_gguf(tmp_path / "tiny.gguf", reference, "gpt-2")
    monkeypatch.delattr(riftco._native, "read_gguf_metadata", raising=False)
    args = build_parser().parse_args(["generate", "--model", str(gguf_path), "hi"])
    with pytest.raises(riftco.ModelStateError):
        generate_command._tokenizer(args)
    with pytest.raises(UsageError, match="--system needs --chat"):
        generate_command.run(argparse.Namespace(**{**vars(args), "system": "x"}))


@pytest.mark.skipif(not SMOLLM.is_file(), reason=SMOLLM2_MISSING)
@pytest.mark.skipif(
    not hasattr(riftco._native, "read_gguf_metadata"),
    reason="this build of riftco has no GGUF reader (riftco._native.read_gguf_metadata)",
)
def test_cli_smollm_gguf_answers_the_capital_of_france() -> None:
    r = riftco_cmd("generate", "--model", SMOLLM, "--chat", "What is the capital of France?",
                   "--temperature", "0", "--max-new-tokens", "32")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = riftco.load_tokenizer(SMOLLM)
    assert "prompt tokens" in r.stderr and tok.name in r.stderr


def test_text_without_the_tokenizer_of_a_real_vocabulary_is_refused() -> None:
    # Byte tokens into a model of 300 tokens would return noise: the error says what to pass.
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
        vocab_size=300, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=16
    ))
    for prompt in ("hello", b"hello"):
        with pytest.raises(riftco.TokenError, match=r"300 tokens.*tokenizer=riftco.load_tokenizer"):
            riftco.generate(model, prompt, 4)
    # Token ids are ids: the continuation is ids from the whole vocabulary (the greedy ones),
    # checked on the path generate takes (the prompt as one sequence, then one-token steps), so
    # the logits are the same bits at every SIMD level and no near-tie can order them apart.
    ids = riftco.generate(model, [1, 280, 299], 4, temperature=0.0)
    assert isinstance(ids, list) and len(ids) == 4
    session = model.decode_session()
    logits = session.decode_tokens([1, 280, 299])
    for t in ids:
        assert t == int(np.argmax(logits))
        logits = session.decode_token(t)


def test_pretraining_with_a_tokenizer_writes_a_run_that_uses_it(
    folder: Path, reference: Any, tmp_path: Path
) -> None:
    # riftco pretrain --tokenizer: the corpus in the tokenizer's ids, the model with its
    # vocabulary and BOS/EOS ids, the run folder with its tokenizer files.
    data = tmp_path / "data.txt"
    data.write_text("def add(a, b):\n    return a + b\n" * 400)
    out = tmp_path / "run"
    r = riftco_cmd(
        "pretrain", "--tokenizer", folder, "--data", data, "--steps", "3", "--d-model", "16",
        "--n-heads", "2", "--n-layers", "1", "--d-ff", "32", "--max-seq-len", "32",
        "--seq-len", "32", "--batch-size", "2", "--no-plots", "--no-progress", "--out", out,
        "--max-new-tokens", "4",
    )
    assert r.returncode == 0, r.stderr
    vocab_size = reference.get_vocab_size(with_added_tokens=True)
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == vocab_size
    assert config["eos_token_id"] == reference.token_to_id("<|im_end|>")
    expected = len(reference.encode(data.read_text()).ids)
    meta = json.loads((out / "training_metadata.json").read_text())
    assert f"{expected:,} tokens" in meta["corpus"]["description"]
    assert (out / "tokenizer.json").is_file()
    tok = riftco.load_tokenizer(out)
    assert tok.encode("def add") == reference.encode("def add").ids
    assert tok.chat_template.source == tt.CHATML
    assert f"ln {vocab_size}" in r.stdout and "tokens) ---" in r.stdout
    gen = riftco_cmd("generate", "--model", out, "def", "--max-new-tokens", "3",
                     "--temperature", "0")
    assert gen.returncode == 0 and "tokenizer.json" in gen.stderr, gen.stderr
    bad = riftco_cmd("pretrain", "--tokenizer", tmp_path / "missing", "--out", tmp_path / "x")
    one_error_line(bad, "--tokenizer", "missing")
    assert not (tmp_path / "x").exists()


def test_a_runs_tokenizer_whose_base_is_gone_is_an_error_not_byte_tokens(
    folder: Path, tmp_path: Path
) -> None:
    # A full post-training run of a model with its own vocabulary, its base moved away: byte
    # tokens would read its 49k-token ids as bytes (noise, exit 0). Say what is missing.
    run = tmp_path / "run"
    run.mkdir()
    riftco.load_model(folder).save(run / "model.safetensors")
    gone = tmp_path / "moved" / "model.safetensors"
    (run / "training_metadata.json").write_text(json.dumps({"base_model": str(gone)}))
    with pytest.raises(riftco.ModelStateError, match=r"moved/model.safetensors.*is gone"):
        riftco.load_tokenizer(run)
    one_error_line(riftco_cmd("generate", "--model", run, "hi"), "is gone")
    # A byte-level run needs no base for its tokens.
    byte_run = tmp_path / "byte_run"
    byte_run.mkdir()
    riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
        vocab_size=256, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=16
    )).save(byte_run / "model.safetensors")
    (byte_run / "training_metadata.json").write_text(json.dumps({"base_model": str(gone)}))
    assert riftco.load_tokenizer(byte_run).is_bytes


def test_full_post_training_carries_the_tokenizer_and_records_an_absolute_base(
    folder: Path, tmp_path: Path
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": f"Say {i}."},
                                 {"role": "assistant", "content": f"{i}."}]}) + "\n"
        for i in range(40)
    ))
    # From another folder, with a relative --model: the run records where the base really is.
    rel = os.path.relpath(folder, tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "riftco", "post-train", "--model", rel, "--data", str(rows),
         "--fine-tuning-method", "full", "--steps", "1", "--batch-size", "2",
         "--no-plots", "--no-progress", "--max-new-tokens", "2", "--out", "run"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "run" / "training_metadata.json").read_text())
    assert Path(meta["base_model"]).is_absolute() and Path(meta["base_model"]).is_file()
    assert (tmp_path / "run" / "tokenizer.json").is_file()
    # A whole model with its own tokenizer: it no longer needs the base.
    tok = riftco.load_tokenizer(tmp_path / "run")
    assert str(tmp_path / "run") in tok.name, tok.name
    assert tok.encode("Say 3.") == riftco.load_tokenizer(folder).encode("Say 3.")


def test_a_large_vocabulary_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    """A folder whose model has more than 256 tokens but no tokenizer.json is not a byte-level
    model: ``generate`` and ``post-train`` refuse it with one line (exit 2, nothing written)
    instead of feeding it bytes (found by a fresh-clone review: a traceback after training)."""
    config = riftco.TransformerConfig(vocab_size=300, d_model=32, n_heads=4, n_layers=1, d_ff=64, max_seq_len=32)
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    riftco.DecoderOnlyTransformer(config).save(str(folder / "model.safetensors"))
    r = riftco_cmd("generate", "--model", folder, "Hello")
    assert r.returncode == 2 and "no tokenizer" in r.stderr and "300 tokens" in r.stderr, r.stderr
    out = tmp_path / "run"
    r = riftco_cmd("post-train", "--model", folder, "--steps", "1", "--out", out)
    assert r.returncode == 2 and "no tokenizer" in r.stderr and "300 tokens" in r.stderr, r.stderr
    assert not out.exists()
