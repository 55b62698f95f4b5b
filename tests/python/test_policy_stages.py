"""Activation-checkpointing policies in the training stages and the examples: the stage configs
check every spelling and the budget, ``training_metadata.json`` records the resolved plan (the
policy stays out of the model state), and ``--activation-checkpointing`` /
``--activation-memory-budget`` work in ``examples/pretrain.py`` and ``examples/post_train.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco
from test_policies import PLAN_KEYS

ROOT = Path(__file__).resolve().parents[2]



# ---------------------------------------------------------------------------------------------
# Stage configs and metadata
# ---------------------------------------------------------------------------------------------


def stage_corpus() -> riftco.Corpus:
    full = riftco.default_corpus()
    return riftco.Corpus(
        tokens=full.tokens[:20_000].copy(), description="stdlib head", files=full.files[:2]
    )


def stage_model_config() -> riftco.TransformerConfig:
    return riftco.TransformerConfig(
        vocab_size=256, d_model=32, n_heads=4, n_layers=3, d_ff=64, max_seq_len=16
    )


def tiny_stage(**kwargs: Any) -> riftco.PretrainingConfig:
    base: dict[str, Any] = dict(
        steps=2, batch_size=2, seq_len=16, warmup_steps=1, eval_batches=1, save_every=2
    )
    return riftco.PretrainingConfig(**{**base, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "policy"),
    [
        (dict(activation_checkpointing="segments:2"), "segments:2"),
        (dict(activation_checkpointing="selective:dots,block,disabled"), None),
        (dict(activation_memory_budget="64MiB"), "budget:67108864"),
        (dict(activation_checkpointing="auto"), "auto"),
    ],
    ids=["segments", "list", "budget", "auto"],
)
def test_stage_metadata_records_the_plan(
    tmp_path: Path, kwargs: dict[str, Any], policy: str | None
) -> None:
    lines: list[str] = []
    cfg = tiny_stage(**kwargs)
    meta = riftco.run_pretraining(
        stage_model_config(), cfg, stage_corpus(), tmp_path, progress=False, log=lines.append
    )
    saved = json.loads((tmp_path / riftco.METADATA_FILE).read_text())
    plan = saved["activation_checkpointing_plan"]
    assert plan == meta["activation_checkpointing_plan"]
    assert set(plan) == PLAN_KEYS and len(plan["per_block"]) == 3
    want = policy or kwargs["activation_checkpointing"]
    assert plan["policy"] == want == saved["activation_checkpointing"]
    assert saved["training_config"]["activation_memory_budget"] == kwargs.get(
        "activation_memory_budget"
    )
    assert f"activation checkpointing plan: {plan['summary']}" in lines
    if policy in {"auto", "budget:67108864"}:
        m = plan["measurement"]
        assert (m["batch"], m["seq"]) == (cfg.batch_size, cfg.seq_len)
    # Not model state: the saved model loads with the default policy.
    assert riftco.load_model(tmp_path).activation_checkpointing == "disabled"


def test_post_training_records_the_plan_with_lora(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(stage_model_config())
    cfg = riftco.PostTrainingConfig(
        steps=2,
        batch_size=2,
        seq_len=16,
        warmup_steps=1,
        eval_batches=1,
        save_every=2,
        lora_rank=2,
        activation_memory_budget=10 * 2**20,
    )
    meta = riftco.run_post_training(model, cfg, stage_corpus(), tmp_path, progress=False)
    plan = meta["activation_checkpointing_plan"]
    assert plan["policy"] == "budget:10485760" == model.activation_checkpointing
    assert plan["predicted_peak_bytes"] <= 10 * 2**20
    assert meta["stage"] == "post_training_lora" and model.has_lora


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        (dict(activation_checkpointing="segments:0"), ['"segments:0"']),
        (dict(activation_checkpointing="selective:fast"), ['"fast"', '"dots"']),
        (dict(activation_checkpointing=["block"]), ["['block']", "comma-separated"]),
        (dict(activation_memory_budget="12XB"), ['"12XB"']),
        (
            dict(activation_checkpointing="auto", activation_memory_budget=100),
            ['"auto"', "pick one"],
        ),
    ],
    ids=repr,
)
def test_stage_configs_check_policies(kwargs: dict[str, Any], needles: list[str]) -> None:
    for cls in (riftco.PretrainingConfig, riftco.PostTrainingConfig):
        with pytest.raises(riftco.ConfigError) as e:
            cls(**kwargs)
        for needle in needles:
            assert needle in str(e.value), (needle, str(e.value))


def test_stage_policies_that_do_not_fit_the_model(tmp_path: Path) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        (dict(activation_checkpointing="segments:4"), "n_layers = 3"),
        (dict(activation_checkpointing="block,block"), "2 given"),
        (dict(activation_memory_budget=1000), "smallest achievable peak"),
    ]
    for kwargs, needle in cases:
        out = tmp_path / "out"
        with pytest.raises(riftco.ConfigError, match=needle):
            riftco.run_pretraining(
                stage_model_config(),
                tiny_stage(**kwargs),
                stage_corpus(),
                out,
                progress=False,
            )
        # Checked before the output folder is created.
        assert not out.exists(), (kwargs, sorted(out.iterdir()))
        model = riftco.DecoderOnlyTransformer(stage_model_config())
        post = riftco.PostTrainingConfig(
            steps=2, batch_size=2, seq_len=16, warmup_steps=1, eval_batches=1, **kwargs
        )
        with pytest.raises(riftco.ConfigError, match=needle):
            riftco.run_post_training(model, post, stage_corpus(), out, progress=False)
        assert not out.exists(), (kwargs, sorted(out.iterdir()))


@pytest.mark.parametrize("stage", ["pretraining", "post_training"])
def test_an_integer_budget_of_another_type_is_stored_as_an_int(tmp_path: Path, stage: str) -> None:
    # np.int64 was accepted, kept, and then crashed json.dump of training_metadata.json after
    # training, leaving no metadata.
    budget = np.int64(64 * 2**20)
    common: dict[str, Any] = dict(
        steps=2, batch_size=2, seq_len=16, warmup_steps=1, eval_batches=1, save_every=2
    )
    if stage == "pretraining":
        cfg: riftco.PretrainingConfig | riftco.PostTrainingConfig = riftco.PretrainingConfig(
            activation_memory_budget=budget, **common
        )
    else:
        cfg = riftco.PostTrainingConfig(activation_memory_budget=budget, **common)
    assert type(cfg.activation_memory_budget) is int
    assert cfg.activation_memory_budget == 64 * 2**20
    assert json.loads(json.dumps(cfg.to_dict()))["activation_memory_budget"] == 64 * 2**20
    out = tmp_path / "out"
    if isinstance(cfg, riftco.PretrainingConfig):
        meta = riftco.run_pretraining(
            stage_model_config(), cfg, stage_corpus(), out, progress=False
        )
    else:
        model = riftco.DecoderOnlyTransformer(stage_model_config())
        meta = riftco.run_post_training(model, cfg, stage_corpus(), out, progress=False)
    written = json.loads((out / riftco.METADATA_FILE).read_text())
    assert written == json.loads(json.dumps(meta))
    assert written["training_config"]["activation_memory_budget"] == 64 * 2**20
    assert written["activation_checkpointing"] == "budget:67108864"
    assert written["complete"] is True


# ---------------------------------------------------------------------------------------------
# Example flags
# ---------------------------------------------------------------------------------------------

TINY_MODEL = ["--d-model", "32", "--n-heads", "2", "--n-layers", "2", "--d-ff", "64"]
TINY_TRAIN = [
    "--max-seq-len",
    "32",
    "--steps",
    "2",
    "--batch-size",
    "2",
    "--seq-len",
    "16",
    "--warmup-steps",
    "1",
    "--no-progress",
]


def run_example(name: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


@pytest.mark.parametrize("name", ["pretrain.py", "post_train.py"])
def test_help_lists_the_policy_forms(name: str) -> None:
    r = run_example(name, "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    for needle in (
        "--activation-checkpointing POLICY",
        "--activation-memory-budget SIZE",
        "segments:K",
        "auto",
        "selective[:NAME]",
        "list of disabled/block/selective[:NAME], one per layer",
        "attention_ffn (saves attention+o+gate+up; the default)",
        "dots (saves",
        "(default: disabled)",
        "64MiB",
        "| budget:SIZE (",
    ):
        assert needle in text, (needle, text)


def test_pretrain_with_a_budget_then_post_train_selective(tmp_path: Path, text_file: Path) -> None:
    out = tmp_path / "pre"
    r = run_example(
        "pretrain.py",
        *TINY_MODEL,
        *TINY_TRAIN,
        "--data",
        text_file,
        "--out",
        out,
        "--activation-memory-budget",
        "64MiB",
    )
    assert r.returncode == 0, r.stderr
    assert "activation checkpointing plan: budget:67108864 → " in r.stderr
    meta = json.loads((out / riftco.METADATA_FILE).read_text())
    assert meta["activation_checkpointing"] == "budget:67108864"
    assert meta["activation_checkpointing_plan"]["predicted_peak_bytes"] <= 64 * 2**20
    post = tmp_path / "post"
    r = run_example(
        "post_train.py",
        "--model",
        out,
        "--data",
        text_file,
        "--out",
        post,
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
        "4",
        "--activation-checkpointing",
        "selective:dots,block",
    )
    assert r.returncode == 0, r.stderr
    assert "activation checkpointing plan: selective:dots,block → " in r.stderr
    meta = json.loads((post / riftco.METADATA_FILE).read_text())
    assert meta["activation_checkpointing_plan"]["per_block"] == ["selective:dots", "block"]
    # A budget below the smallest achievable peak: exit 2 before any training, no folder.
    refused = tmp_path / "refused"
    r = run_example(
        "post_train.py",
        "--model",
        out,
        "--data",
        text_file,
        "--out",
        refused,
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--no-progress",
        "--activation-memory-budget",
        "1kB",
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "smallest achievable peak" in r.stderr.strip().splitlines()[-1], r.stderr
    assert "--- sample" not in r.stdout
    assert not refused.exists()


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_bytes(bytes(riftco.default_corpus().tokens[:30_000]))
    return path


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--activation-checkpointing", "segments:0"], ['"segments:0"']),
        (["--activation-checkpointing", "selective:fast"], ['"fast"', '"dots"']),
        (["--activation-checkpointing", "segments:3"], ['"segments:3"', "n_layers = 2"]),
        (["--activation-checkpointing", "segments:9"], ['"segments:9"', "n_layers = 2"]),
        (["--activation-checkpointing", "block,block,block"], ["3 given"]),
        (["--activation-memory-budget", "12XB"], ['"12XB"']),
        (["--activation-memory-budget", "1kB"], ["1000 bytes", "smallest achievable peak"]),
        (
            ["--activation-checkpointing", "block", "--activation-memory-budget", "1MiB"],
            ["pick one"],
        ),
    ],
    ids=repr,
)
def test_bad_flags_are_one_line_errors(
    tmp_path: Path, text_file: Path, args: list[str], needles: list[str]
) -> None:
    out = tmp_path / "out"
    r = run_example(
        "pretrain.py", *TINY_MODEL, *TINY_TRAIN, "--data", text_file, "--out", out, *args
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and "error:" in lines[-1], r.stderr
    for needle in needles:
        assert needle in lines[-1], (needle, r.stderr)
    # Bad input fails before anything is created (a policy that does not fit the model or a
    # budget below the smallest peak used to leave an empty output folder).
    assert not out.exists(), sorted(out.iterdir())


def test_output_folder_removes_only_the_empty_folders_it_created(tmp_path: Path) -> None:
    from riftco.cli import output_folder

    nested = tmp_path / "a" / "b" / "out"
    with pytest.raises(riftco.ConfigError), output_folder(nested) as out:
        assert out.is_dir()
        raise riftco.ConfigError("bad input found after the folder was made")
    assert not (tmp_path / "a").exists()
    # A folder that existed before, or that holds a file, is kept.
    (tmp_path / "kept").mkdir()
    with pytest.raises(KeyboardInterrupt), output_folder(tmp_path / "kept" / "out") as out:
        (out / "model.safetensors").write_bytes(b"x")
        raise KeyboardInterrupt
    assert (tmp_path / "kept" / "out" / "model.safetensors").is_file()
    with output_folder(tmp_path / "ok") as out:
        pass
    assert out.is_dir()
