"""benches/scaling_model.py's ZeRO-3 and memory model against what it claims to follow: the
published Llama 3 parameter counts (transformers' own LlamaForCausalLM, where installed), ZeRO's
1.5x DDP's bytes (Rajbhandari et al. 2020, section 7), riftco's measured activation bytes, and
the bounds any overlap schedule must meet."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    path = ROOT / "benches" / "scaling_model.py"
    spec = importlib.util.spec_from_file_location("scaling_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scaling_model"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


sm = _load()


def test_llama3_shapes_count_the_parameters_transformers_builds() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (reference venv)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    for shape in sm.LLAMA3:
        config = transformers.LlamaConfig(
            vocab_size=shape.vocab, hidden_size=shape.d_model, intermediate_size=shape.d_ff,
            num_hidden_layers=shape.n_layers, num_attention_heads=shape.n_heads,
            num_key_value_heads=shape.n_kv_heads, tie_word_embeddings=shape.tied,
        )
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(config)
        counted = sum(p.numel() for p in model.parameters())  # shared tensors listed once
        assert shape.parameters() == counted, shape.name


def test_zero3_moves_one_and_a_half_times_ddps_bytes() -> None:
    for shape in sm.LLAMA3:
        steps = sm.zero3_steps(shape, 2048, lora=False)
        p = shape.parameters()
        ddp = 2 * 4 * p
        if shape.tied:
            # every parameter: gathered for the forward, again for the backward (a tied head's
            # second gather is the embedding's), its gradient reduce-scattered once
            assert sm.zero3_bytes(steps) == 1.5 * ddp, shape.name
        else:
            # an untied embedding and head are gathered once each (the embedding's backward
            # reads no weights; the head's forward and backward share one gather)
            once = shape.vocab * shape.d_model * 2 + shape.d_model
            assert sm.zero3_bytes(steps) == 4 * (3 * (p - once) + 2 * once), shape.name
        # 2 gathers per block, one or two for the embedding and head; a reduce-scatter per unit
        assert sum(1 for s in steps if s.gather_bytes) == 2 * shape.n_layers + 2
        assert sum(1 for s in steps if s.reduce_bytes) == shape.n_layers + (1 if shape.tied else 2)
        total = sum(s.flops_per_token for s in steps)
        assert total == pytest.approx(shape.flops_per_token(2048, lora=False), rel=1e-12)


def test_overlapped_step_lies_between_compute_and_the_serial_step() -> None:
    shape = sm.LLAMA_1B
    for lora in (False, True):
        steps = sm.zero3_steps(shape, 2048, lora)
        compute = shape.flops_per_token(2048, lora) * 8 * 2048 / sm.ASSUMED_FLOPS
        for n in (2, 8, 64):
            for gbit in (10, 100, 1e6):
                comm, plain, over = sm.zero3_step_s(steps, 8 * 2048, sm.ASSUMED_FLOPS, n, gbit)
                assert plain == pytest.approx(compute + comm, rel=1e-12)
                assert compute <= over <= plain
                # the first gather (before any compute) is never hidden
                assert over >= compute + sm.collective_s(steps[0].gather_bytes, n, gbit)
        # with one rank there is nothing to exchange
        assert sm.zero3_step_s(steps, 2048, 1e12, 1, 10)[0] == 0.0


def test_activation_model_matches_riftcos_measured_bytes() -> None:
    # the slope of the values kept per block without checkpointing (benches/policies.py)
    policies = json.loads((ROOT / "benches" / "results" / "policies.json").read_text())
    kept = {r["n_layers"]: r["retained"] for r in policies["depth"] if r["policy"] == "disabled"}
    reference = sm.Shape("reference", 256, 256, 688, 8, 8, 8, tied=False)
    slope = (kept[32] - kept[4]) / 28
    assert sm.block_values_bytes(reference, 8 * 256) == pytest.approx(slope, rel=1e-3)
    # the activation peak of a LoRA step on the Llama-3.2-1B shape, `block`, 1 x 1024 tokens
    llama = json.loads((ROOT / "benches" / "results" / "memory_real_models_llama.json").read_text())
    assert llama["batch"] == 1 and llama["seq"] == 1024
    row = next(r for r in llama["rows"] if r["row"].startswith("riftco block"))
    measured = row["peak_bytes"]["activation"]
    assert sm.activation_bytes(sm.LLAMA_1B, 1024) == pytest.approx(measured, rel=5e-3)


def test_memory_per_rank_and_the_largest_models() -> None:
    for shape in sm.LLAMA3:
        for lora in (False, True):
            one = sm.memory_per_rank(shape, 0, 1, lora)
            for zero in range(4):
                assert sm.memory_per_rank(shape, zero, 1, lora) == one
                per_n = [sm.memory_per_rank(shape, zero, n, lora) for n in sm.MEMORY_RANKS]
                assert all(a >= b for a, b in zip(per_n, per_n[1:]))
            # ZeRO-3's states shrink as 1/N; its gathered units and the activations do not
            floor = sm.gathered_unit_bytes(shape, lora) + sm.activation_bytes(shape, 2048)
            assert sm.memory_per_rank(shape, 3, 64, lora) > floor
    # full training under ZeRO 0 is 16 bytes per parameter plus activations and workspace
    shape = sm.LLAMA3[2]
    extra = sm.activation_bytes(shape, 2048) + sm.LOSS_WORKSPACE_BYTES
    assert sm.memory_per_rank(shape, 0, 8, False) == 16 * shape.parameters() + extra
    # each stage fits at least what the one before it fits, at every N
    for n in sm.RANKS:
        for lora in (False, True):
            sizes = [sm.largest_fitting(zero, n, lora).parameters() for zero in range(4)]
            assert sizes == sorted(sizes)
            fitted = sm.largest_fitting(3, n, lora)
            assert sm.memory_per_rank(fitted, 3, n, lora) <= sm.DEVICE_BYTES
