"""The pure-Python training layer: stage configs, corpora, batch sampling, stage pipelines and
generation."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import riftco
from riftco.configs import PostTrainingConfig, PretrainingConfig
from riftco.data import (
    DEFAULT_CORPUS_MAX_BYTES,
    BatchSampler,
    Corpus,
    CorpusError,
    default_corpus,
    default_post_training_corpus,
    load_corpus,
)
from riftco.generation import generate, sample_token
from riftco.stages import (
    ADAPTER_DIR,
    METADATA_FILE,
    MODEL_STATE_FILE,
    OutputDirError,
    load_model,
    prepare_out_dir,
    run_post_training,
    run_pretraining,
)

TINY: dict[str, Any] = dict(vocab_size=256, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_seq_len=32, seed=3)


def tiny_config() -> riftco.TransformerConfig:
    return riftco.TransformerConfig(**TINY)


def tiny_pretraining(**overrides: Any) -> PretrainingConfig:
    fields: dict[str, Any] = dict(
        steps=3,
        batch_size=2,
        seq_len=16,
        lr=3e-3,
        warmup_steps=1,
        seed=5,
        save_every=2,
        eval_batches=2,
    )
    fields.update(overrides)
    return PretrainingConfig(**fields)


@pytest.fixture(scope="module")
def small_corpus() -> Corpus:
    full = default_corpus()
    return Corpus(
        tokens=full.tokens[:40_000].copy(), description="stdlib head", files=full.files[:3]
    )


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory, small_corpus: Corpus) -> Path:
    out = tmp_path_factory.mktemp("pretrain")
    run_pretraining(tiny_config(), tiny_pretraining(), small_corpus, out, progress=False)
    return out


# ----------------------------------------------------------------------------- configs


def test_exported_from_package() -> None:
    for name in (
        "PretrainingConfig",
        "PostTrainingConfig",
        "run_pretraining",
        "run_post_training",
        "generate",
        "default_corpus",
        "load_corpus",
        "BatchSampler",
        "CorpusError",
        "TrainingInterrupted",
    ):
        assert hasattr(riftco, name), name
    assert riftco.PretrainingConfig is PretrainingConfig


def test_seed_snippet_configs() -> None:
    p = PretrainingConfig(attention="flash", activation_checkpointing="block")
    q = PostTrainingConfig(fine_tuning_method="lora", activation_checkpointing="block")
    assert p.activation_checkpointing == "block" and q.fine_tuning_method == "lora"
    assert PretrainingConfig().activation_checkpointing == "disabled"
    with pytest.raises(AttributeError):
        p.steps = 3  # type: ignore[misc]
    assert json.loads(json.dumps(q.to_dict()))["lora_rank"] == 8


@pytest.mark.parametrize(
    ("field", "value", "shown", "valid"),
    [
        # The policy is checked by the native parser: its message quotes like the model's.
        (
            "activation_checkpointing",
            "blocks",
            '"blocks"',
            '"disabled", "block", "segments:K" .*"selective:NAME"',
        ),
        ("attention", "sparse", "'sparse'", "'flash', 'materialized'"),
        ("lr_schedule", "linear", "'linear'", "'cosine', 'constant'"),
    ],
)
def test_invalid_choice_lists_valid_values(field: str, value: str, shown: str, valid: str) -> None:
    with pytest.raises(riftco.ConfigError, match=valid) as e:
        PretrainingConfig(**dict[str, Any]({field: value}))
    assert shown in str(e.value) and field in str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, riftco.RiftcoError)


def test_invalid_fine_tuning_method() -> None:
    with pytest.raises(riftco.ConfigError, match="'lora', 'full'"):
        PostTrainingConfig(fine_tuning_method="qlora")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("steps", 0),
        ("batch_size", -2),
        ("seq_len", 0),
        ("lr", 0.0),
        ("lr", -1e-3),
        ("lr", math.nan),
        ("warmup_steps", -1),
        ("save_every", 0),
        ("weight_decay", -0.1),
        ("steps", 2.5),
        ("steps", True),
        ("validation_fraction", 0.0),
    ],
)
def test_bad_numbers_name_field_and_value(field: str, value: object) -> None:
    with pytest.raises(riftco.ConfigError) as e:
        PretrainingConfig(**dict[str, Any]({field: value}))
    assert field in str(e.value) and repr(value) in str(e.value)


@pytest.mark.parametrize(
    ("field", "value"), [("lora_rank", 0), ("lora_alpha", -1.0), ("lora_mlp", 1)]
)
def test_bad_lora_fields(field: str, value: object) -> None:
    with pytest.raises(riftco.ConfigError, match=field):
        PostTrainingConfig(**dict[str, Any]({field: value}))


def test_lr_schedule_warmup_then_cosine() -> None:
    cfg = PretrainingConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [cfg.lr_at(s) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0) and lrs[99] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    const = PretrainingConfig(steps=20, lr=0.5, warmup_steps=0, lr_schedule="constant")
    assert {const.lr_at(s) for s in range(20)} == {0.5}


# ----------------------------------------------------------------------------- data


def test_default_corpus_is_the_stdlib_in_sorted_order() -> None:
    a = default_corpus()
    b = default_corpus()
    assert 1_000_000 < len(a) <= DEFAULT_CORPUS_MAX_BYTES
    assert np.array_equal(a.tokens, b.tokens) and a.files == b.files
    assert list(a.files) == sorted(a.files)
    assert all(f.endswith(".py") for f in a.files)
    skipped = {"test", "tests", "idlelib", "lib2to3", "site-packages", "pydoc_data"}
    assert not any(skipped & set(f.split("/")[:-1]) for f in a.files)
    assert bytes(a.tokens[:200]).startswith(f"# ==== {a.files[0]} ====\n".encode())
    assert a.tokens.dtype == np.uint8


def test_default_post_training_corpus_is_other_text() -> None:
    c = default_post_training_corpus()
    assert len(c) > 100_000 and "language reference" in c.description
    text = bytes(c.tokens[:2000]).decode()
    assert "statement" in text and "\\n" not in text


def test_load_corpus_files_and_dirs(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.txt").write_text("bravo\n")
    (tmp_path / "d" / "sub" / "a.txt").write_text("alpha\n")
    (tmp_path / "d" / "blob.bin").write_bytes(b"\0\1\2")
    (tmp_path / "one.txt").write_text("one")
    c = load_corpus([tmp_path / "one.txt", tmp_path / "d"])
    text = bytes(c.tokens).decode()
    assert text.index("one") < text.index("bravo") < text.index("alpha")
    assert not any(f.endswith("blob.bin") for f in c.files)


def test_load_corpus_errors(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus([tmp_path / "missing.txt"])
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(CorpusError, match="empty"):
        load_corpus([tmp_path / "empty.txt"])
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(CorpusError, match="empty"):
        load_corpus([tmp_path / "emptydir"])
    with pytest.raises(CorpusError, match="no data paths"):
        load_corpus([])
    assert issubclass(CorpusError, riftco.RiftcoError)


def test_sampler_is_deterministic_and_windows_are_contiguous() -> None:
    data = np.arange(1000, dtype=np.int64).astype(np.uint8)
    a = BatchSampler(data, 4, 9, seed=1).batches(3)
    b = BatchSampler(data, 4, 9, seed=1).batches(3)
    c = BatchSampler(data, 4, 9, seed=2).batches(3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    for block in a:
        assert block.shape == (4, 10) and block.dtype == np.int64
        assert np.all((np.diff(block, axis=1) % 256) == 1)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(2, 200),
    seq=st.integers(1, 50),
    batch=st.integers(1, 5),
    seed=st.integers(0, 2**32),
)
def test_sampler_windows_stay_in_bounds(n: int, seq: int, batch: int, seed: int) -> None:
    data = np.random.default_rng(0).integers(0, 256, size=n, dtype=np.uint8)
    if n < seq + 1:
        with pytest.raises(CorpusError, match="needs at least"):
            BatchSampler(data, batch, seq, seed)
        return
    block = BatchSampler(data, batch, seq, seed).next_batch()
    assert block.shape == (batch, seq + 1)
    for row in block:
        starts = [i for i in range(n - seq) if np.array_equal(data[i : i + seq + 1], row)]
        assert starts


# ----------------------------------------------------------------------------- stages


@pytest.mark.parametrize("policy", ["disabled", "block"])
def test_pretraining_writes_state_and_metadata(
    tmp_path: Path, small_corpus: Corpus, policy: str
) -> None:
    meta = run_pretraining(
        tiny_config(),
        tiny_pretraining(activation_checkpointing=policy),
        small_corpus,
        tmp_path,
        progress=False,
    )
    for name in (MODEL_STATE_FILE, "config.json", METADATA_FILE):
        assert (tmp_path / name).is_file(), name
    saved = json.loads((tmp_path / METADATA_FILE).read_text())
    assert saved["activation_checkpointing"] == policy == meta["activation_checkpointing"]
    assert saved["attention"] == "flash" and saved["complete"] and saved["saved_step"] == 3
    assert len(saved["losses"]) == 3 and all(math.isfinite(x) for x in saved["losses"])
    assert saved["tokens_per_s"] > 0 and saved["wall_time_s"] > 0
    assert saved["peak_memory_bytes"]["activation"] > 0
    assert set(saved["peak_memory_bytes"]) >= {
        "parameter",
        "gradient",
        "optimizer_state",
        "activation",
    }
    assert math.isfinite(saved["validation_loss_before"]) and math.isfinite(
        saved["validation_loss_after"]
    )
    assert saved["model_config"]["d_model"] == 32 and saved["training_config"]["steps"] == 3
    model = load_model(tmp_path)
    assert model.config.d_model == 32


def test_policies_give_equal_losses(tmp_path: Path, small_corpus: Corpus) -> None:
    runs = {
        policy: run_pretraining(
            tiny_config(),
            tiny_pretraining(activation_checkpointing=policy, steps=4),
            small_corpus,
            tmp_path / policy,
            progress=False,
        )
        for policy in ("disabled", "block")
    }
    np.testing.assert_allclose(runs["block"]["losses"], runs["disabled"]["losses"], rtol=1e-5)
    assert runs["block"]["activation_checkpointing"] == "block"


def test_pretraining_learns(tmp_path: Path, small_corpus: Corpus) -> None:
    meta = run_pretraining(
        tiny_config(),
        tiny_pretraining(steps=40, batch_size=4, warmup_steps=5, save_every=40),
        small_corpus,
        tmp_path,
        progress=False,
    )
    assert meta["losses"][0] > 5.0
    assert np.mean(meta["losses"][-5:]) < meta["losses"][0] - 1.0
    assert meta["validation_loss_after"] < meta["validation_loss_before"]


def test_pretraining_input_errors(tmp_path: Path, small_corpus: Corpus) -> None:
    with pytest.raises(riftco.ConfigError, match="seq_len 64 exceeds the model's max_seq_len 32"):
        run_pretraining(
            tiny_config(), tiny_pretraining(seq_len=64), small_corpus, tmp_path, progress=False
        )
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputDirError, match="cannot write to output folder"):
        run_pretraining(
            tiny_config(), tiny_pretraining(), small_corpus, blocker / "out", progress=False
        )
    with pytest.raises(OutputDirError):
        prepare_out_dir(blocker)
    tiny_text = Corpus(tokens=np.frombuffer(b"short text", dtype=np.uint8).copy(), description="x")
    with pytest.raises(CorpusError, match="needs at least"):
        run_pretraining(
            tiny_config(), tiny_pretraining(), tiny_text, tmp_path / "o", progress=False
        )


def _named(model: riftco.DecoderOnlyTransformer) -> dict[str, np.ndarray[Any, Any]]:
    return {n: np.array(p.numpy(), copy=True) for n, p in model.named_parameters()}


def test_lora_post_training_keeps_base_weights(
    pretrained: Path, small_corpus: Corpus, tmp_path: Path
) -> None:
    state_hash = hashlib.sha256((pretrained / MODEL_STATE_FILE).read_bytes()).hexdigest()
    model = load_model(pretrained)
    before = _named(model)
    cfg = PostTrainingConfig(
        fine_tuning_method="lora",
        activation_checkpointing="block",
        lora_rank=4,
        steps=3,
        batch_size=2,
        seq_len=16,
        lr=1e-2,
        warmup_steps=0,
        eval_batches=1,
    )
    meta = run_post_training(
        model, cfg, small_corpus, tmp_path, progress=False, base_model=pretrained
    )
    assert (tmp_path / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    assert (tmp_path / ADAPTER_DIR / "adapter_config.json").is_file()
    assert not (tmp_path / MODEL_STATE_FILE).exists()
    saved = json.loads((tmp_path / METADATA_FILE).read_text())
    assert saved["fine_tuning_method"] == "lora" and saved["lora"]["rank"] == 4
    assert saved["activation_checkpointing"] == "block" and saved["stage"] == "post_training_lora"
    assert all(math.isfinite(x) for x in meta["losses"])
    after = _named(model)
    assert before.keys() == after.keys()
    for name in before:
        np.testing.assert_array_equal(before[name], after[name], err_msg=name)
    assert model.has_lora
    assert hashlib.sha256((pretrained / MODEL_STATE_FILE).read_bytes()).hexdigest() == state_hash
    # the adapter loads back onto a fresh copy of the base and reproduces the trained model
    fresh = load_model(pretrained)
    fresh.load_lora(str(tmp_path / ADAPTER_DIR))
    tokens = np.arange(16, dtype=np.int64).reshape(1, 16) + 97
    np.testing.assert_allclose(
        fresh.logits(tokens).numpy(), model.logits(tokens).numpy(), rtol=1e-5, atol=1e-6
    )
    base_logits = load_model(pretrained).logits(tokens).numpy()
    assert not np.allclose(base_logits, model.logits(tokens).numpy())


def test_full_post_training_from_path(
    pretrained: Path, small_corpus: Corpus, tmp_path: Path
) -> None:
    cfg = PostTrainingConfig(
        fine_tuning_method="full", steps=2, batch_size=2, seq_len=16, eval_batches=1
    )
    meta = run_post_training(pretrained, cfg, small_corpus, tmp_path, progress=False)
    assert (tmp_path / MODEL_STATE_FILE).is_file() and (tmp_path / "config.json").is_file()
    assert meta["base_model"] == str(pretrained / MODEL_STATE_FILE)
    changed = load_model(tmp_path)
    base = load_model(pretrained)
    assert any(
        not np.array_equal(a, b) for a, b in zip(_named(changed).values(), _named(base).values())
    )


def test_post_training_missing_model(tmp_path: Path, small_corpus: Corpus) -> None:
    with pytest.raises(riftco.ModelStateError, match="no model state"):
        run_post_training(
            tmp_path / "nope", PostTrainingConfig(), small_corpus, tmp_path / "o", progress=False
        )


# ----------------------------------------------------------------------------- generation


def test_generate_is_seeded_and_greedy_at_zero(pretrained: Path) -> None:
    model = load_model(pretrained)
    a = generate(model, "def ", 12, temperature=1.0, top_k=20, seed=7)
    b = generate(model, b"def ", 12, temperature=1.0, top_k=20, seed=7)
    assert a == b and len(a) == 12
    greedy = generate(model, "def ", 10, temperature=0.0, seed=1)
    assert greedy == generate(model, "def ", 10, temperature=0.0, seed=99)
    session = model.decode_session()
    logits = np.zeros(0, dtype=np.float32)
    for t in b"def ":
        logits = session.decode_token(t)
    manual = bytearray()
    for _ in range(10):
        tok = int(np.argmax(logits[:256]))
        manual.append(tok)
        logits = session.decode_token(tok)
    assert greedy == bytes(manual)
    assert generate(model, "x", 0) == b""


def test_generate_errors(pretrained: Path) -> None:
    model = load_model(pretrained)
    with pytest.raises(riftco.TokenError, match="max_seq_len is 32"):
        generate(model, "abcd", 30)
    with pytest.raises(riftco.TokenError, match="at least one byte"):
        generate(model, "", 3)
    with pytest.raises(riftco.TokenError, match="temperature"):
        generate(model, "a", 3, temperature=-1.0)
    with pytest.raises(riftco.TokenError, match="top_k"):
        generate(model, "a", 3, top_k=0)


def test_sample_token_top_k() -> None:
    logits = np.array([0.0, 5.0, 4.0, -3.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    draws = {sample_token(logits, 1.0, 2, rng) for _ in range(200)}
    assert draws == {1, 2}
    assert sample_token(logits, 0.0, None, rng) == 1
    assert sample_token(logits, 1.0, 1, rng) == 1


# ----------------------------------------------------------------------------- signals and files


def test_metadata_file_mode_matches_model_files(pretrained: Path) -> None:
    modes = {
        name: stat.S_IMODE((pretrained / name).stat().st_mode)
        for name in (MODEL_STATE_FILE, "config.json", METADATA_FILE)
    }
    assert modes == dict.fromkeys(modes, 0o644), {k: oct(v) for k, v in modes.items()}


def _interrupt_after_first_save(out: Path) -> Callable[[str], None]:
    """A ``log`` callback that sends this process SIGINT once a save exists."""

    def log(line: str) -> None:
        if (out / METADATA_FILE).exists():
            os.kill(os.getpid(), signal.SIGINT)

    return log


def _ignore_or_custom(kind: str) -> Any:
    if kind == "ignored":
        return signal.SIG_IGN

    def custom(signum: int, frame: FrameType | None) -> None:
        raise AssertionError("the stage's handler should have been in place")

    return custom


@pytest.mark.parametrize("inherited", ["ignored", "custom"])
def test_stage_handles_sigint_whatever_was_inherited(
    tmp_path: Path, small_corpus: Corpus, inherited: str
) -> None:
    # A process started in the background by a shell inherits SIGINT ignored; the stage must
    # still stop on Ctrl-C, leave the last save intact, and restore the caller's handler.
    previous = _ignore_or_custom(inherited)
    saved_handler = signal.signal(signal.SIGINT, previous)
    try:
        with pytest.raises(riftco.TrainingInterrupted) as info:
            run_pretraining(
                tiny_config(),
                tiny_pretraining(steps=1000, save_every=2, log_every=1),
                small_corpus,
                tmp_path,
                progress=False,
                log=_interrupt_after_first_save(tmp_path),
            )
        assert signal.getsignal(signal.SIGINT) is previous
    finally:
        signal.signal(signal.SIGINT, saved_handler)
    meta = json.loads((tmp_path / METADATA_FILE).read_text())
    assert info.value.saved_step == meta["saved_step"] >= 2 and not meta["complete"]
    assert load_model(tmp_path).config.d_model == TINY["d_model"]
