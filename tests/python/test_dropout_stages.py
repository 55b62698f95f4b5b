"""Dropout in the Python stages: training mode in the steps, one probability rule for the stage
configs and the flags, a failed setup that leaves the caller's model as it was, ``None`` keeping
a loaded model's probabilities, the flag paragraphs of docs/runs.md, the ``dropout_step`` setter and
the loaders' ``determinism_check=``."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco

ROOT = Path(__file__).resolve().parents[2]


def model_config(**kwargs: Any) -> riftco.TransformerConfig:
    base: dict[str, Any] = dict(
        vocab_size=256, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=16, seed=1
    )
    return riftco.TransformerConfig(**{**base, **kwargs})


def stage_corpus() -> riftco.Corpus:
    full = riftco.default_corpus()
    return riftco.Corpus(tokens=full.tokens[:20_000].copy(), description="head", files=())


def stage_config(**kwargs: Any) -> riftco.PostTrainingConfig:
    base: dict[str, Any] = dict(
        steps=2, batch_size=2, seq_len=16, warmup_steps=1, eval_batches=1, save_every=2
    )
    return riftco.PostTrainingConfig(**{**base, **kwargs})


def settings(model: riftco.DecoderOnlyTransformer) -> tuple[Any, ...]:
    c = model.config
    return (
        model.attention,
        model.activation_checkpointing,
        c.attention_dropout,
        c.residual_dropout,
        model.has_lora,
        model.training,
    )


# ---------------------------------------------------------------------------------------------
# 1. The stage trains in training mode
# ---------------------------------------------------------------------------------------------


def test_a_model_in_eval_mode_trains_with_dropout_and_gets_its_mode_back(tmp_path: Path) -> None:
    cfg = stage_config(fine_tuning_method="full", attention_dropout=0.5, residual_dropout=0.5)
    runs = {}
    for mode in ("train", "eval"):
        model = riftco.DecoderOnlyTransformer(model_config())
        model.train(mode == "train")
        meta = riftco.run_post_training(model, cfg, stage_corpus(), tmp_path / mode, progress=False)
        runs[mode] = meta
        assert model.training == (mode == "train")
    # Both drop in both steps: the same masks, so the same losses.
    assert runs["eval"]["dropout"]["dropout_step"] == 2
    assert runs["eval"]["losses"] == runs["train"]["losses"]


def test_the_caller_mode_is_restored_when_the_stage_raises(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(model_config()).eval()
    seen = []

    def log(line: str) -> None:
        seen.append(model.training)
        if line.startswith("activation checkpointing plan"):
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        riftco.run_post_training(
            model, stage_config(), stage_corpus(), tmp_path, progress=False, log=log
        )
    assert seen == [True, True]  # training mode inside the stage (after validation too)
    assert not model.training


# ---------------------------------------------------------------------------------------------
# 2. One probability rule
# ---------------------------------------------------------------------------------------------

FIELDS = ["attention_dropout", "residual_dropout", "lora_dropout"]
REFUSED: list[Any] = [
    0.99999999,
    10**400,
    -(10**400),
    1,
    np.float64(1.0),
    np.float32(0.99999999),
    math.inf,
    math.nan,
    -0.0001,
    True,
    np.bool_(False),
    "0.1",
    [0.1],
    1j,
]
ACCEPTED: list[Any] = [0, 0.0, 0.5, np.float32(0.1), np.int64(0), np.float64(0.25), 0.9999999]


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", REFUSED, ids=lambda v: repr(v)[:24])
def test_a_refused_probability_is_a_config_error_naming_field_and_value(
    field: str, value: Any
) -> None:
    with pytest.raises(riftco.ConfigError) as e:
        riftco.PostTrainingConfig(**{field: value})
    assert f"{field} = {value!r}" in str(e.value) and "[0, 1)" in str(e.value)
    # The model config refuses the same values.
    if field != "lora_dropout":
        with pytest.raises(riftco.ConfigError):
            model_config(**{field: value})


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", ACCEPTED, ids=repr)
def test_an_accepted_probability_is_stored_as_a_float(field: str, value: Any) -> None:
    cfg = riftco.PostTrainingConfig(**{field: value})
    stored = getattr(cfg, field)
    assert type(stored) is float and stored == float(value)
    json.dumps(cfg.to_dict())
    if field != "lora_dropout":
        assert getattr(model_config(**{field: value}), field) == pytest.approx(float(value))


def test_the_rounding_message_says_why() -> None:
    with pytest.raises(riftco.ConfigError, match=r"0\.99999999: rounds to 1 as a 32-bit float"):
        riftco.PostTrainingConfig(attention_dropout=0.99999999)


# ---------------------------------------------------------------------------------------------
# 3. A failed setup leaves the caller's model unchanged; flags are checked before the sample
# ---------------------------------------------------------------------------------------------


def test_a_policy_that_does_not_fit_leaves_the_model_unchanged(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(model_config(attention_dropout=0.05))
    before = settings(model)
    cfg = stage_config(
        attention_dropout=0.2,
        residual_dropout=0.3,
        attention="materialized",
        activation_checkpointing="segments:5",
    )
    with pytest.raises(riftco.ConfigError, match="segments:5"):
        riftco.run_post_training(model, cfg, stage_corpus(), tmp_path / "o", progress=False)
    assert settings(model) == before
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("policy", [{}, {"activation_memory_budget": "64MiB"}], ids=repr)
def test_an_unwritable_out_dir_leaves_the_model_unchanged(
    tmp_path: Path, policy: dict[str, Any]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    model = riftco.DecoderOnlyTransformer(model_config(residual_dropout=0.1), **policy)
    before = settings(model)
    cfg = stage_config(
        fine_tuning_method="full",
        attention_dropout=0.2,
        attention="materialized",
        activation_checkpointing="block",
    )
    with pytest.raises(riftco.OutputDirError):
        riftco.run_post_training(model, cfg, stage_corpus(), blocker / "out", progress=False)
    assert settings(model) == before


def test_a_budget_the_base_model_exceeds_fails_before_the_adapters(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(model_config())
    before = settings(model)
    cfg = stage_config(attention_dropout=0.2, activation_memory_budget=1)
    with pytest.raises(riftco.ConfigError):
        riftco.run_post_training(model, cfg, stage_corpus(), tmp_path / "o", progress=False)
    assert settings(model) == before  # no adapters added
    assert not (tmp_path / "o").exists()


def run_example(name: str, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


@pytest.fixture
def saved_model(tmp_path: Path) -> Path:
    folder = tmp_path / "pre"
    folder.mkdir()
    model = riftco.DecoderOnlyTransformer(
        model_config(attention_dropout=0.1, residual_dropout=0.05)
    )
    model.save(folder / riftco.MODEL_STATE_FILE)
    return folder


@pytest.mark.parametrize("flag", ["--lora-dropout", "--attention-dropout", "--residual-dropout"])
def test_post_train_refuses_a_probability_rounding_to_one_before_the_sample(
    tmp_path: Path, saved_model: Path, flag: str
) -> None:
    out = tmp_path / "out"
    r = run_example(
        "post_train.py", "--model", saved_model, "--out", out, flag, "0.99999999",
        "--steps", "1", "--sample-tokens", "4", "--no-progress",
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "sample" not in r.stdout, r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr and flag in last and "32-bit" in last, r.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# 4. None keeps the model's probabilities
# ---------------------------------------------------------------------------------------------


def test_the_stage_config_defaults_to_none() -> None:
    cfg = riftco.PostTrainingConfig()
    assert (cfg.attention_dropout, cfg.residual_dropout, cfg.lora_dropout) == (None, None, 0.0)
    assert cfg.to_dict()["attention_dropout"] is None


@pytest.mark.parametrize("given", ["object", "path"])
def test_a_default_config_keeps_a_loaded_model_s_dropout(
    tmp_path: Path, saved_model: Path, given: str
) -> None:
    model_or_path: Any = riftco.load_model(saved_model) if given == "object" else saved_model
    out = tmp_path / "out"
    meta = riftco.run_post_training(
        model_or_path, stage_config(fine_tuning_method="full"), stage_corpus(), out,
        progress=False,
    )
    assert meta["dropout"]["attention_dropout"] == pytest.approx(0.1)
    assert meta["dropout"]["residual_dropout"] == pytest.approx(0.05)
    assert meta["model_config"]["attention_dropout"] == pytest.approx(0.1)
    reloaded = riftco.load_model(out).config
    assert reloaded.attention_dropout == pytest.approx(0.1)
    assert reloaded.residual_dropout == pytest.approx(0.05)
    # A number replaces the model's value; the other keeps its own.
    meta = riftco.run_post_training(
        saved_model, stage_config(fine_tuning_method="full", residual_dropout=0.0),
        stage_corpus(), tmp_path / "out2", progress=False,
    )
    assert meta["dropout"]["residual_dropout"] == 0.0
    assert meta["dropout"]["attention_dropout"] == pytest.approx(0.1)


def test_post_train_keeps_the_model_s_dropout_by_default(tmp_path: Path, saved_model: Path) -> None:
    help_text = " ".join(run_example("post_train.py", "--help").stdout.split())
    for flag in ("--attention-dropout P", "--residual-dropout P"):
        assert re.search(re.escape(flag) + r" [^-]*\(default: the model's\)", help_text), help_text
    out = tmp_path / "out"
    r = run_example(
        "post_train.py", "--model", saved_model, "--out", out, "--fine-tuning-method", "full",
        "--steps", "1", "--batch-size", "2", "--warmup-steps", "1", "--sample-tokens", "0",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / riftco.METADATA_FILE).read_text())
    assert meta["dropout"]["attention_dropout"] == pytest.approx(0.1)
    assert meta["dropout"]["residual_dropout"] == pytest.approx(0.05)


# ---------------------------------------------------------------------------------------------
# 5. The docs list the flags
# ---------------------------------------------------------------------------------------------


def paragraph(text: str, start: str) -> str:
    at = text.index(start)
    return text[at : text.index("\n\n", at)]


def test_docs_flag_paragraphs_list_the_dropout_flags() -> None:
    readme = (ROOT / "docs" / "runs.md").read_text()
    pre = paragraph(readme, "Flags of `pretrain.py`")
    post = paragraph(readme, "`post_train.py` loads")
    for flag in ("--attention-dropout", "--residual-dropout"):
        assert flag in pre and flag in post
    assert "--lora-dropout" in post
    assert "default 0" in pre and "default: the model's own" in post


# ---------------------------------------------------------------------------------------------
# 6. The dropout_step setter and the loaders' determinism_check
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, False, -1, 2**64, 1.0, "3", None, np.float64(2)], ids=repr)
def test_dropout_step_setter_refuses_anything_but_a_u64(value: Any) -> None:
    model = riftco.DecoderOnlyTransformer(model_config())
    model.dropout_step = 5
    with pytest.raises(riftco.ConfigError, match=r"dropout_step must be an int in \[0, 2\*\*64\)"):
        model.dropout_step = value
    assert model.dropout_step == 5


@pytest.mark.parametrize("value", [0, 2**64 - 1, np.uint64(7), np.int64(3)], ids=repr)
def test_dropout_step_setter_takes_a_u64(value: Any) -> None:
    model = riftco.DecoderOnlyTransformer(model_config())
    model.dropout_step = value
    assert model.dropout_step == int(value)


@pytest.mark.parametrize("check", ["off", "metadata", "values"])
def test_loaders_take_determinism_check(saved_model: Path, check: str) -> None:
    path = saved_model / riftco.MODEL_STATE_FILE
    assert riftco.DecoderOnlyTransformer.load(path, determinism_check=check).determinism_check == (
        check
    )
    assert riftco.load_model(saved_model, determinism_check=check).determinism_check == check
    assert riftco.load_model(saved_model).determinism_check == "metadata"


def test_loaders_refuse_an_unknown_determinism_check(saved_model: Path) -> None:
    with pytest.raises(riftco.ConfigError, match="bitwise"):
        riftco.DecoderOnlyTransformer.load(
            saved_model / riftco.MODEL_STATE_FILE, determinism_check="bitwise"
        )
    with pytest.raises(riftco.ConfigError, match="bitwise"):
        riftco.load_model(saved_model, determinism_check="bitwise")
