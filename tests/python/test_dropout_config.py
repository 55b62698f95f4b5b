"""Dropout configuration from Python: ``TransformerConfig(attention_dropout=, residual_dropout=)``,
``enable_lora(dropout=)``, ``set_dropout``, training mode (``train()`` / ``eval()`` /
``training``), the dropout step, the Hugging Face / PEFT files, the stage configs and the
examples' ``--attention-dropout`` / ``--residual-dropout`` / ``--lora-dropout``."""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco

ROOT = Path(__file__).resolve().parents[2]


def tiny(**kwargs: Any) -> riftco.TransformerConfig:
    base: dict[str, Any] = dict(
        vocab_size=64, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=16, seed=3
    )
    return riftco.TransformerConfig(**{**base, **kwargs})


def block(batch: int = 2, seq_plus_one: int = 9) -> np.ndarray[Any, Any]:
    return (np.arange(batch * seq_plus_one, dtype=np.int64).reshape(batch, seq_plus_one) * 7) % 64


BAD_VALUES: list[Any] = [
    1.0,
    1.5,
    -0.1,
    float("nan"),
    float("inf"),
    float("-inf"),
    "0.1",
    True,
    False,
    [0.1],
]


def test_config_fields_default_to_zero_and_round_trip() -> None:
    c = tiny()
    assert (c.attention_dropout, c.residual_dropout) == (0.0, 0.0)
    d = tiny(attention_dropout=0.1, residual_dropout=np.float32(0.2))
    assert (d.attention_dropout, d.residual_dropout) == (0.1, 0.2)
    assert d.to_dict()["attention_dropout"] == 0.1 and d.to_dict()["residual_dropout"] == 0.2
    assert riftco.TransformerConfig.from_dict(d.to_dict()) == d
    assert pickle.loads(pickle.dumps(d)) == d
    assert "attention_dropout=0.1, residual_dropout=0.2" in repr(d)
    assert d != c
    # A dict saved before the dropout fields existed loads with no dropout.
    old = c.to_dict()
    del old["attention_dropout"], old["residual_dropout"]
    assert riftco.TransformerConfig.from_dict(old) == c
    assert tiny(attention_dropout=0, residual_dropout=0.999).residual_dropout == 0.999


@pytest.mark.parametrize("field", ["attention_dropout", "residual_dropout"])
@pytest.mark.parametrize("value", BAD_VALUES, ids=repr)
def test_bad_config_dropout_is_a_config_error_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(riftco.ConfigError, match=f"{field} = .*expected a probability in"):
        tiny(**{field: value})


def test_a_probability_that_rounds_to_one_as_f32_is_refused_as_given() -> None:
    with pytest.raises(riftco.ConfigError, match=r"= 0\.99999999999: rounds to 1"):
        tiny(attention_dropout=0.99999999999)


@pytest.mark.parametrize("value", BAD_VALUES, ids=repr)
def test_bad_lora_dropout_is_a_config_error_and_adds_no_adapters(value: Any) -> None:
    model = riftco.DecoderOnlyTransformer(tiny())
    with pytest.raises(riftco.ConfigError, match="lora_dropout = .*expected a probability in"):
        model.enable_lora(rank=2, dropout=value)
    assert not model.has_lora


def test_train_and_eval_return_the_model_and_set_training() -> None:
    model = riftco.DecoderOnlyTransformer(tiny())
    assert model.training is True
    assert model.eval() is model and model.training is False
    assert model.train() is model and model.training is True
    assert model.train(False) is model and model.training is False


def test_dropout_step_counts_training_forwards_that_drop() -> None:
    model = riftco.DecoderOnlyTransformer(
        tiny(residual_dropout=0.1), activation_checkpointing="block"
    )
    assert model.dropout_step == 0
    model.loss(block()).backward()
    assert model.dropout_step == 1
    model.eval()
    model.loss(block())
    assert model.dropout_step == 1, "eval mode never drops"
    model.train()
    model.dropout_step = 2**64 - 1
    assert model.dropout_step == 2**64 - 1
    model.dropout_step = 5
    model.loss(block())
    assert model.dropout_step == 6
    model.logits(block(2, 8))
    assert model.dropout_step == 6, "logits() never drops"
    with pytest.raises(riftco.ConfigError, match="dropout_step must be an int"):
        model.dropout_step = -1
    plain = riftco.DecoderOnlyTransformer(tiny())
    plain.loss(block())
    assert plain.dropout_step == 0, "no probability above 0: no dropout step"


def test_set_dropout_validates_and_keeps_the_others() -> None:
    model = riftco.DecoderOnlyTransformer(tiny(attention_dropout=0.1))
    model.set_dropout(residual_dropout=0.2)
    assert (model.config.attention_dropout, model.config.residual_dropout) == (0.1, 0.2)
    with pytest.raises(riftco.ConfigError, match="residual_dropout = 1.0"):
        model.set_dropout(attention_dropout=0.3, residual_dropout=1.0)
    assert (model.config.attention_dropout, model.config.residual_dropout) == (0.1, 0.2)
    with pytest.raises(riftco.LoraError, match="no adapters"):
        model.set_dropout(attention_dropout=0.3, lora_dropout=0.1)
    assert model.config.attention_dropout == 0.1, "unchanged on error"
    model.enable_lora(rank=2, dropout=0.05)
    assert model.lora_dropout == 0.05
    model.set_dropout(lora_dropout=0.1)
    assert model.lora_dropout == 0.1
    model.set_lora_active(False)
    assert model.lora_dropout == 0.0


def test_config_json_and_adapter_config_json(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(tiny(attention_dropout=0.1, residual_dropout=0.2))
    model.save(tmp_path / "model.safetensors")
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["attention_dropout"] == 0.1
    assert hf["riftco"]["residual_dropout"] == 0.2
    back = riftco.DecoderOnlyTransformer.load(tmp_path / "model.safetensors")
    assert back.config == model.config

    model.enable_lora(rank=2, dropout=0.05)
    model.save_lora(tmp_path / "adapter")
    peft = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert peft["lora_dropout"] == 0.05
    fresh = riftco.DecoderOnlyTransformer(tiny())
    fresh.load_lora(tmp_path / "adapter")
    assert fresh.lora_dropout == 0.05


def test_transformers_reads_attention_dropout(tmp_path: Path) -> None:
    try:
        import transformers  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pytest.skip("transformers is not installed: the LlamaConfig comparison is skipped")
    model = riftco.DecoderOnlyTransformer(tiny(attention_dropout=0.1, residual_dropout=0.2))
    model.save(tmp_path / "model.safetensors")
    theirs = transformers.LlamaConfig.from_pretrained(tmp_path)
    assert theirs.attention_dropout == 0.1


def _load_quietly(path: Path) -> riftco.DecoderOnlyTransformer:
    # An edited config.json is not the one the state's hash names: load() warns about it.
    with pytest.warns(RuntimeWarning, match="config.json beside this model state"):
        return riftco.DecoderOnlyTransformer.load(path)


def test_edited_config_json_dropout_applies_and_is_validated_as_written(tmp_path: Path) -> None:
    # They used to be ignored: the copy in the state's metadata won, even over invalid values.
    model = riftco.DecoderOnlyTransformer(tiny(attention_dropout=0.1, residual_dropout=0.2))
    state = tmp_path / "model.safetensors"
    model.save(state)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    hf = json.loads(path.read_text())
    hf["attention_dropout"] = 0.25  # what transformers' save_pretrained leaves after an edit
    hf["riftco"]["residual_dropout"] = 0.05
    path.write_text(json.dumps(hf))
    back = _load_quietly(state)
    assert (back.config.attention_dropout, back.config.residual_dropout) == (0.25, 0.05)
    hf["riftco"]["attention_dropout"] = 0.3  # both copies edited, to different values
    path.write_text(json.dumps(hf))
    with pytest.raises(riftco.ModelStateError, match=r"attention_dropout = 0\.25 disagrees"):
        riftco.DecoderOnlyTransformer.load(state)
    for bad, shown in [
        (-0.1, "-0.1"),
        (1.0, "1.0"),
        ("0.1", '"0.1"'),
        (True, "true"),
        ([0.1], "[0.1]"),
        ({}, "{}"),
        (0.99999999, "0.99999999"),  # its f32 is 1.0
        (1e39, "1e+39"),  # its f32 is inf
    ]:
        hf = dict(saved, attention_dropout=bad)
        path.write_text(json.dumps(hf))
        with pytest.raises(riftco.ModelStateError) as info:
            riftco.DecoderOnlyTransformer.load(state)
        message = str(info.value)
        assert "config.json" in message and f"attention_dropout = {shown}" in message, message


def test_edited_adapter_config_json_lora_dropout_applies_and_is_validated(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(tiny())
    model.enable_lora(rank=2, dropout=0.1)
    model.save_lora(tmp_path)
    path = tmp_path / "adapter_config.json"
    peft = json.loads(path.read_text())
    peft["lora_dropout"] = 0.05
    path.write_text(json.dumps(peft))
    fresh = riftco.DecoderOnlyTransformer(tiny())
    fresh.load_lora(tmp_path)
    assert fresh.lora_dropout == 0.05
    for bad, shown in [("nonsense", '"nonsense"'), (0.99999999, "0.99999999"), (1e39, "1e+39")]:
        peft["lora_dropout"] = bad
        path.write_text(json.dumps(peft))
        fresh = riftco.DecoderOnlyTransformer(tiny())
        with pytest.raises(riftco.ModelStateError) as info:
            fresh.load_lora(tmp_path)
        message = str(info.value)
        assert "adapter_config.json" in message, message
        assert f"lora_dropout = {shown}: expected a probability in [0, 1)" in message, message
        assert not fresh.has_lora


def test_transformers_edit_of_attention_dropout_is_loaded(tmp_path: Path) -> None:
    try:
        import transformers  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pytest.skip("transformers is not installed: the save_pretrained round trip is skipped")
    model = riftco.DecoderOnlyTransformer(tiny(attention_dropout=0.1))
    model.save(tmp_path / "model.safetensors")
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    theirs.attention_dropout = 0.25
    theirs.save_pretrained(tmp_path)
    assert _load_quietly(tmp_path / "model.safetensors").config.attention_dropout == 0.25


# ---------------------------------------------------------------------------------------------
# Stage configs and examples
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["attention_dropout", "residual_dropout", "lora_dropout"])
@pytest.mark.parametrize("value", [1.0, -0.5, math.nan, "0.1", True, None], ids=repr)
def test_post_training_config_checks_dropout(field: str, value: Any) -> None:
    if value is None and field != "lora_dropout":
        # None keeps the model's own probability (test_dropout_stages.py).
        kwargs: dict[str, Any] = {field: value}
        assert getattr(riftco.PostTrainingConfig(**kwargs), field) is None
        return
    with pytest.raises(riftco.ConfigError, match=f"{field} = .*expected a probability in"):
        riftco.PostTrainingConfig(**{field: value})


def test_lora_dropout_needs_lora() -> None:
    with pytest.raises(riftco.ConfigError, match="lora_dropout = 0.1 needs fine_tuning_method"):
        riftco.PostTrainingConfig(fine_tuning_method="full", lora_dropout=0.1)
    assert riftco.PostTrainingConfig(lora_dropout=0.1).to_dict()["lora_dropout"] == 0.1


def stage_corpus() -> riftco.Corpus:
    full = riftco.default_corpus()
    return riftco.Corpus(tokens=full.tokens[:20_000].copy(), description="head", files=())


def test_post_training_sets_and_records_dropout(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(
        riftco.TransformerConfig(
            vocab_size=256, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=16
        )
    )
    cfg = riftco.PostTrainingConfig(
        steps=2,
        batch_size=2,
        seq_len=16,
        warmup_steps=1,
        eval_batches=1,
        save_every=2,
        lora_rank=2,
        attention_dropout=0.1,
        residual_dropout=0.2,
        lora_dropout=0.05,
    )
    meta = riftco.run_post_training(model, cfg, stage_corpus(), tmp_path, progress=False)
    saved = json.loads((tmp_path / riftco.METADATA_FILE).read_text())
    # Two training steps drop; the validation passes (eval mode) do not.
    want = dict(attention_dropout=0.1, residual_dropout=0.2, lora_dropout=0.05, dropout_step=2)
    assert saved["dropout"] == meta["dropout"] == want
    assert saved["model_config"]["attention_dropout"] == 0.1
    assert saved["lora"]["dropout"] == 0.05 and model.training
    peft = json.loads((tmp_path / riftco.ADAPTER_DIR / "adapter_config.json").read_text())
    assert peft["lora_dropout"] == 0.05


def run_example(name: str, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


@pytest.mark.parametrize("name", ["pretrain.py", "post_train.py"])
def test_help_lists_the_dropout_flags_with_defaults(name: str) -> None:
    r = run_example(name, "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    flags = ["--attention-dropout P", "--residual-dropout P"]
    if name == "post_train.py":
        flags.append("--lora-dropout P")
    for flag in flags:
        assert flag in text, (flag, text)
    # post_train.py keeps the loaded model's attention and residual dropout by default.
    zero_defaults = 1 if name == "post_train.py" else len(flags)
    assert text.count("(default: 0.0)") >= zero_defaults, text


@pytest.mark.parametrize("value", ["1", "-0.1", "nan", "x"])
def test_bad_dropout_flag_is_a_one_line_error(tmp_path: Path, value: str) -> None:
    out = tmp_path / "out"
    r = run_example("pretrain.py", "--attention-dropout", value, "--out", out)
    assert r.returncode == 2, (r.stdout, r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr and "--attention-dropout" in last, r.stderr
    assert not out.exists()


def test_pretrain_records_dropout(tmp_path: Path) -> None:
    out = tmp_path / "out"
    data = tmp_path / "text.txt"
    data.write_bytes(bytes(riftco.default_corpus().tokens[:30_000]))
    r = run_example(
        "pretrain.py",
        *("--d-model", "32", "--n-heads", "2", "--n-layers", "2", "--d-ff", "64"),
        *("--max-seq-len", "32", "--seq-len", "32", "--steps", "2", "--batch-size", "2"),
        *("--warmup-steps", "1", "--sample-tokens", "0", "--no-progress"),
        *("--attention-dropout", "0.1", "--residual-dropout", "0.05"),
        *("--data", data, "--out", out),
    )
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / riftco.METADATA_FILE).read_text())
    assert meta["model_config"]["attention_dropout"] == 0.1
    assert meta["dropout"]["residual_dropout"] == 0.05 and meta["dropout"]["dropout_step"] == 2
    assert riftco.load_model(out).config.residual_dropout == 0.05
