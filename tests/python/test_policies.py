"""Activation-checkpointing policies from Python: every form trains bit for bit like
``disabled``; ``checkpoint(..., save=[...])`` with ``named`` values keeps them from the forward
run; bad policies, lists and budgets are ``ConfigError``s naming the value; the plan dict. The
stage metadata and the example flags are in ``test_policy_stages.py``.

Parity is bitwise (``np.array_equal``), not approximate: a checkpoint's replay runs the same
kernels on the same values in the same order, and a selective checkpoint rebuilds the kept nodes
with their recorded values and VJPs, so every gradient is accumulated in the order of the plain
graph.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco
from riftco import functional as F

F32 = npt.NDArray[np.float32]

SMALL = dict(vocab_size=64, d_model=32, n_heads=4, n_layers=4, d_ff=88, max_seq_len=16)
BATCH, SEQ = 2, 16


def small_config(**overrides: Any) -> riftco.TransformerConfig:
    kwargs: dict[str, Any] = {**SMALL, **overrides}
    return riftco.TransformerConfig(**kwargs)


def tokens(seed: int = 0) -> npt.NDArray[np.int64]:
    return np.random.default_rng(seed).integers(0, 64, size=(BATCH, SEQ + 1))


SMALLEST_PEAK = re.compile(
    r"smallest achievable peak activation at batch \d+, seq \d+ is (\d+) bytes"
)


def smallest_peak(model: riftco.DecoderOnlyTransformer) -> int:
    """The smallest achievable peak the planner names for a budget of 0 bytes (the model's
    policy is restored)."""
    policy = model.activation_checkpointing
    model.set_activation_checkpointing(activation_memory_budget=0)
    with pytest.raises(riftco.ConfigError) as e:
        model.activation_checkpointing_plan(BATCH, SEQ)
    model.set_activation_checkpointing(policy)
    m = SMALLEST_PEAK.search(str(e.value))
    assert m, str(e.value)
    return int(m.group(1))


# ---------------------------------------------------------------------------------------------
# Every form trains like disabled, bit for bit
# ---------------------------------------------------------------------------------------------

FORMS: list[Any] = [
    "block",
    "segments:1",
    "segments:2",
    "segments:3",
    "segments:4",
    "auto",
    "selective",
    *(f"selective:{name}" for name in riftco.SELECTIVE_POLICIES),
    "selective:q+k+v",
    "selective:" + "+".join(riftco.BLOCK_VALUE_NAMES),
    ["disabled", "block", "selective:dots", "selective:attention"],
    ("selective", "disabled", "block", "block"),
    "block,selective:attention,disabled,selective:q+swiglu",
    # Budgets, in bytes relative to the smallest achievable peak of the model (see `step`).
    ("budget", 1.0),
    ("budget", 1.25),
    ("budget", 100.0),
]


def form_id(form: Any) -> str:
    if isinstance(form, tuple) and form and form[0] == "budget":
        return f"budget-x{form[1]}"
    return str(form)


def one_step(
    form: Any, attention: str, lora: bool
) -> tuple[F32, list[F32], list[F32], riftco.DecoderOnlyTransformer]:
    """Loss, every trainable gradient and the trainable parameters after one Adam step."""
    model = riftco.DecoderOnlyTransformer(small_config(), attention=attention)
    if lora:
        model.enable_lora(rank=4, mlp=True)
    if isinstance(form, tuple) and form and form[0] == "budget":
        budget = int(smallest_peak(model) * form[1])
        model.set_activation_checkpointing(activation_memory_budget=budget)
        plan = model.activation_checkpointing_plan(BATCH, SEQ)
        assert plan["predicted_peak_bytes"] <= budget, plan
    elif form != "disabled":
        model.set_activation_checkpointing(form)
    params = model.parameters()
    opt = riftco.Adam(params, lr=1e-2)
    loss = model.loss(tokens())
    loss.backward()
    grads = []
    for p in params:
        g = p.grad
        assert g is not None
        grads.append(g)
    opt.step()
    return loss.numpy(), grads, [p.numpy() for p in params], model


@pytest.mark.parametrize("lora", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("attention", ["flash", "materialized"])
@pytest.mark.parametrize("form", FORMS, ids=form_id)
def test_every_form_trains_bitwise_like_disabled(form: Any, attention: str, lora: bool) -> None:
    want_loss, want_grads, want_params, _ = one_step("disabled", attention, lora)
    loss, grads, params, model = one_step(form, attention, lora)
    assert model.activation_checkpointing != "disabled"
    assert np.array_equal(loss, want_loss), (loss, want_loss)
    assert len(grads) == len(want_grads) > 0
    for i, (got, want) in enumerate(zip(grads, want_grads)):
        assert np.array_equal(got, want), f"gradient {i} differs"
    for i, (got, want) in enumerate(zip(params, want_params)):
        assert np.array_equal(got, want), f"parameter {i} after Adam differs"


def test_spellings_read_back_canonical() -> None:
    model = riftco.DecoderOnlyTransformer(small_config(), activation_checkpointing="selective")
    assert model.activation_checkpointing == "selective:attention_ffn"
    assert next(iter(riftco.SELECTIVE_POLICIES)) == "attention_ffn"
    model.set_activation_checkpointing(("block", "disabled", "selective:dots", "block"))
    assert model.activation_checkpointing == "block,disabled,selective:dots,block"
    model.set_activation_checkpointing(activation_memory_budget="1KiB")
    assert model.activation_checkpointing == "budget:1024"
    model.set_activation_checkpointing(activation_memory_budget=np.int64(4096))
    assert model.activation_checkpointing == "budget:4096"
    model.set_activation_checkpointing(activation_memory_budget=2**63 - 1)
    assert model.activation_checkpointing == f"budget:{2**63 - 1}"
    # An int budget has the range of a size string (and of the C ABI's uint64_t).
    model.set_activation_checkpointing(activation_memory_budget=2**64 - 1)
    assert model.activation_checkpointing == f"budget:{2**64 - 1}"
    model.set_activation_checkpointing(activation_memory_budget=str(2**64 - 1))
    assert model.activation_checkpointing == f"budget:{2**64 - 1}"
    model.set_activation_checkpointing("disabled", activation_memory_budget=2048)
    assert model.activation_checkpointing == "budget:2048"
    model.set_activation_checkpointing()
    assert model.activation_checkpointing == "disabled"
    assert "segments:3" in repr(
        riftco.DecoderOnlyTransformer(small_config(), activation_checkpointing="segments:3")
    )
    assert (
        riftco.parse_activation_checkpointing(["block"] * 4, n_layers=4)
        == "block,block,block,block"
    )
    assert riftco.parse_activation_checkpointing(None, "2kB") == "budget:2000"


def test_tables() -> None:
    assert riftco.ACTIVATION_CHECKPOINTING_POLICIES == ("disabled", "block", "auto", "selective")
    assert list(riftco.SELECTIVE_POLICIES) == ["attention_ffn", "dots", "attention"]
    for name, saved in riftco.SELECTIVE_POLICIES.items():
        assert isinstance(saved, tuple) and saved, name
        assert set(saved) <= set(riftco.BLOCK_VALUE_NAMES), name
    assert riftco.BLOCK_VALUE_NAMES[0] == "attn_norm" and "attention" in riftco.BLOCK_VALUE_NAMES
    assert riftco.parse_byte_size("64MiB") == 64 * 2**20
    assert riftco.parse_byte_size("1.5 GB") == 1_500_000_000
    assert riftco.parse_byte_size("1000") == 1000
    with pytest.raises(riftco.ConfigError, match='"12XB"'):
        riftco.parse_byte_size("12XB")


def test_the_policy_is_not_model_state(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(small_config(), activation_checkpointing="segments:2")
    model.save(tmp_path / "m.safetensors")
    loaded = riftco.DecoderOnlyTransformer.load(tmp_path / "m.safetensors")
    assert loaded.activation_checkpointing == "disabled"
    loaded = riftco.DecoderOnlyTransformer.load(
        tmp_path / "m.safetensors", activation_memory_budget="1MiB"
    )
    assert loaded.activation_checkpointing == "budget:1048576"
    assert "segments" not in (tmp_path / "config.json").read_text()


# ---------------------------------------------------------------------------------------------
# checkpoint(..., save=[...]) with named values
# ---------------------------------------------------------------------------------------------


def rng_leaf(shape: tuple[int, ...], seed: int, requires_grad: bool = True) -> riftco.Variable:
    data = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return riftco.Variable(data, requires_grad=requires_grad)


class Block:
    """``linear(silu(linear(h, w1)), w2)`` with both products and the SiLU as named values,
    counting how often each named function runs."""

    def __init__(self) -> None:
        self.w1 = rng_leaf((8, 6), 1)
        self.w2 = rng_leaf((6, 8), 2)
        self.calls: Counter[str] = Counter()
        self.outer = 0

    def named(
        self, name: str, fn: Callable[..., riftco.Variable], *inputs: riftco.Variable
    ) -> riftco.Variable:
        def counted(*args: riftco.Variable) -> riftco.Variable:
            self.calls[name] += 1
            return fn(*args)

        return riftco.named(name, counted, *inputs)

    def __call__(self, h: riftco.Variable) -> riftco.Variable:
        self.outer += 1
        z = self.named("up", lambda a: F.linear(a, self.w1), h)
        s = self.named("act", F.silu, z)
        return self.named("down", lambda a: F.linear(a, self.w2), s)

    @property
    def deps(self) -> list[riftco.Variable]:
        return [self.w1, self.w2]


def grads_of(save: list[str] | None) -> tuple[Block, list[F32]]:
    block = Block()
    x = rng_leaf((5, 6), 3)
    y = riftco.checkpoint(block, x, block.deps, save=save)
    F.sum(F.mul(y, y)).backward()
    out = []
    for v in (x, block.w1, block.w2):
        g = v.grad
        assert g is not None
        out.append(g)
    return block, out


@pytest.mark.parametrize("save", [["up"], ["act"], ["up", "down"], ("up", "act", "down")], ids=str)
def test_saved_named_values_are_not_recomputed_and_gradients_are_bitwise(
    save: list[str],
) -> None:
    plain, want = grads_of(None)
    assert plain.outer == 2 and plain.calls == Counter(up=2, act=2, down=2)
    block, got = grads_of(list(save))
    assert block.outer == 2, "the checkpoint callable itself still replays"
    for name in ("up", "act", "down"):
        assert block.calls[name] == (1 if name in save else 2), (name, block.calls)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    # And both equal the graph without any checkpoint.
    ref = Block()
    x = rng_leaf((5, 6), 3)
    y = ref(x)
    F.sum(F.mul(y, y)).backward()
    assert ref.calls == Counter(up=1, act=1, down=1)
    for g, v in zip(got, (x, ref.w1, ref.w2)):
        want_grad = v.grad
        assert want_grad is not None and np.array_equal(g, want_grad)


def test_empty_save_is_the_plain_checkpoint() -> None:
    block, got = grads_of([])
    assert block.calls == Counter(up=2, act=2, down=2)
    _, want = grads_of(None)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def test_named_is_in_functional_and_plain_outside_a_checkpoint() -> None:
    assert F.named is riftco.named
    w = rng_leaf((3, 3), 0)
    x = rng_leaf((2, 3), 1, requires_grad=False)
    calls = []

    def fn(a: riftco.Variable) -> riftco.Variable:
        calls.append(a.shape)
        return F.linear(a, w)

    y = riftco.named("z", fn, x)
    assert calls == [(2, 3)]
    assert np.array_equal(y.numpy(), F.linear(x, w).numpy())
    assert riftco.named("none", lambda: F.scale(w, 2.0)).shape == (3, 3)


def test_an_unknown_save_name_lists_the_names_used() -> None:
    block = Block()
    x = rng_leaf((5, 6), 3)
    with pytest.raises(riftco.CheckpointError) as e:
        riftco.checkpoint(block, x, block.deps, save=["up", "nope"])
    message = str(e.value)
    assert '"nope"' in message
    for name in ("up", "act", "down"):
        assert f'"{name}"' in message, message


def test_a_saved_function_reading_an_outside_graph_value_is_refused() -> None:
    w = rng_leaf((6, 6), 0)

    def fn(h: riftco.Variable) -> riftco.Variable:
        t = F.silu(h)  # a graph value of the callable, not passed to named()
        return riftco.named("bad", lambda a: F.add(a, t), F.linear(h, w))

    with pytest.raises(riftco.CheckpointError, match='"bad"'):
        riftco.checkpoint(fn, rng_leaf((2, 6), 1), [w], save=["bad"])


def test_a_replay_that_diverges_is_refused_and_commits_nothing() -> None:
    w = rng_leaf((4, 4), 0)
    x = rng_leaf((2, 4), 1)
    names = iter(["first", "second"])

    def fn(h: riftco.Variable) -> riftco.Variable:
        # The replay names its value differently from the forward run.
        name = next(names)
        return F.silu(riftco.named(name, lambda a: F.linear(a, w), h))

    y = riftco.checkpoint(fn, x, [w], save=["first"])
    with pytest.raises(riftco.CheckpointError, match="diverged"):
        F.sum(y).backward()
    assert w.grad is None and x.grad is None


def test_named_errors() -> None:
    w = rng_leaf((3, 3), 0)
    with pytest.raises(TypeError, match="input 1 must be a riftco.Variable"):
        riftco.named("z", lambda a, b: a, w, np.ones(3))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must return a riftco.Variable"):
        riftco.named("z", lambda a: 3, w)  # type: ignore[arg-type, return-value]
    boom = ValueError("boom")

    def raises(a: riftco.Variable) -> riftco.Variable:
        raise boom

    with pytest.raises(ValueError) as e:
        riftco.named("z", raises, w)
    assert e.value is boom
    # Inside a saving checkpoint too, the same exception object.
    with pytest.raises(ValueError) as e:
        riftco.checkpoint(lambda h: riftco.named("z", raises, h), w, [], save=["z"])
    assert e.value is boom


@pytest.mark.parametrize("save", ["up", ["up", 3]], ids=["str", "non-str-item"])
def test_save_must_be_a_list_of_names(save: Any) -> None:
    block = Block()
    with pytest.raises(TypeError, match="save must be"):
        riftco.checkpoint(block, rng_leaf((5, 6), 3), block.deps, save=save)
    assert block.outer == 0


def test_existing_checkpoint_rejections_still_hold() -> None:
    w = rng_leaf((3, 3), 0)
    x = rng_leaf((2, 3), 1)
    with pytest.raises(riftco.CheckpointError):
        riftco.checkpoint(lambda h: F.linear(h, w), x, [], save=None)  # w not declared
    with pytest.raises(riftco.CheckpointError):
        riftco.checkpoint(lambda h: F.linear(h, w), x, [w, w], save=["z"])  # duplicate


# ---------------------------------------------------------------------------------------------
# Bad input: a ConfigError naming the value and what is accepted
# ---------------------------------------------------------------------------------------------

BAD: list[tuple[dict[str, Any], list[str]]] = [
    (dict(activation_checkpointing="segments:0"), ['"segments:0"', "K >= 1"]),
    (dict(activation_checkpointing="segments:-1"), ['"segments:-1"', "K >= 1"]),
    (dict(activation_checkpointing="segments:5"), ['"segments:5"', "n_layers = 4", "not clamped"]),
    (dict(activation_checkpointing="segments:x"), ['"segments:x"']),
    (dict(activation_checkpointing="selective:fast"), ['"fast"', '"attention_ffn"', '"dots"']),
    (dict(activation_checkpointing="selective:q+nope"), ['"nope"', '"swiglu"']),
    (dict(activation_checkpointing="full"), ['"full"', '"segments:K"', '"auto"']),
    (dict(activation_checkpointing=["block", "disabled", "block"]), ["3 given", "n_layers = 4"]),
    (dict(activation_checkpointing="block,disabled,block"), ['"block,disabled,block"', "3 given"]),
    (dict(activation_checkpointing=["block"] * 5), ["5 given", "n_layers = 4"]),
    (dict(activation_checkpointing=[]), ["[]", "empty list"]),
    (dict(activation_checkpointing=["block", "auto", "block", "block"]), ['"auto"', "per-block"]),
    (dict(activation_checkpointing=["block", 1, "block", "block"]), ["item 1", "not a string"]),
    (dict(activation_checkpointing=7), ["7", "policy string"]),
    (dict(activation_memory_budget="12XB"), ['"12XB"', '"XB"', "MiB"]),
    (dict(activation_memory_budget="MiB"), ['"MiB"', "no number"]),
    (dict(activation_memory_budget=-1), ["-1", "between 0 and 2^64 - 1"]),
    (dict(activation_memory_budget=2**64), [str(2**64), "between 0 and 2^64 - 1"]),
    (dict(activation_memory_budget=str(2**64)), [str(2**64), "too large"]),
    (dict(activation_memory_budget=2**200), [str(2**200), "between 0 and 2^64 - 1"]),
    (dict(activation_memory_budget="1.5B"), ['"1.5B"', "a fraction of a byte"]),
    (dict(activation_memory_budget="0.1"), ['"0.1"', "a fraction of a byte"]),
    (dict(activation_memory_budget=1.5e6), ["1500000.0", "int (bytes) or a size string"]),
    (dict(activation_memory_budget=True), ["True", "int (bytes) or a size string"]),
    (
        dict(activation_checkpointing="block", activation_memory_budget="64MiB"),
        ["'64MiB'", '"block"', "pick one"],
    ),
]


@pytest.mark.parametrize(("kwargs", "needles"), BAD, ids=lambda v: repr(v)[:60])
def test_bad_policies_are_config_errors_naming_the_value(
    kwargs: dict[str, Any], needles: list[str]
) -> None:
    with pytest.raises(riftco.ConfigError) as e:
        riftco.DecoderOnlyTransformer(small_config(), **kwargs)
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))
    assert isinstance(e.value, ValueError)
    # The setter refuses the same and leaves the policy as it was.
    model = riftco.DecoderOnlyTransformer(small_config(), activation_checkpointing="segments:2")
    policy = kwargs.get("activation_checkpointing")
    budget = kwargs.get("activation_memory_budget")
    with pytest.raises(riftco.ConfigError) as e2:
        model.set_activation_checkpointing(policy, activation_memory_budget=budget)
    assert str(e2.value) == str(e.value)
    assert model.activation_checkpointing == "segments:2"


def test_a_budget_below_the_smallest_peak_names_it() -> None:
    model = riftco.DecoderOnlyTransformer(small_config(), activation_memory_budget=1000)
    with pytest.raises(riftco.ConfigError) as e:
        model.activation_checkpointing_plan(BATCH, SEQ)
    message = str(e.value)
    assert "activation_memory_budget = 1000 bytes" in message and "no plan fits" in message
    m = SMALLEST_PEAK.search(message)
    assert m, message
    smallest = int(m.group(1))
    # The named peak is exactly the smallest: a budget of it fits, one byte less does not.
    model.set_activation_checkpointing(activation_memory_budget=smallest)
    plan = model.activation_checkpointing_plan(BATCH, SEQ)
    assert plan["predicted_peak_bytes"] == smallest
    model.set_activation_checkpointing(activation_memory_budget=smallest - 1)
    with pytest.raises(riftco.ConfigError, match=f"is {smallest} bytes"):
        model.activation_checkpointing_plan(BATCH, SEQ)
    # The training forward plans the same way and raises the same error.
    with pytest.raises(riftco.ConfigError, match="no plan fits"):
        model.loss(tokens())


def test_a_mismatched_policy_fails_at_load(tmp_path: Path) -> None:
    riftco.DecoderOnlyTransformer(small_config()).save(tmp_path / "m.safetensors")
    with pytest.raises(riftco.ConfigError, match=r'"segments:9".*n_layers = 4'):
        riftco.DecoderOnlyTransformer.load(
            tmp_path / "m.safetensors", activation_checkpointing="segments:9"
        )
    with pytest.raises(riftco.ConfigError, match="2 given"):
        riftco.load_model(tmp_path / "m.safetensors", activation_checkpointing=["block"] * 2)


@pytest.mark.parametrize(("batch", "seq"), [(0, 16), (-1, 16), (2, 0), (2, 17)])
def test_plan_shape_out_of_range(batch: int, seq: int) -> None:
    model = riftco.DecoderOnlyTransformer(small_config(), activation_checkpointing="auto")
    with pytest.raises(riftco.ConfigError, match="batch" if batch < 1 else "seq"):
        model.activation_checkpointing_plan(batch, seq)


# ---------------------------------------------------------------------------------------------
# The plan dict
# ---------------------------------------------------------------------------------------------

PLAN_KEYS = {
    "policy",
    "summary",
    "per_block",
    "segments",
    "segment_length",
    "predicted_peak_bytes",
    "predicted_step_seconds",
    "measurement",
}
MEASUREMENT_KEYS = {
    "batch",
    "seq",
    "n_layers",
    "boundary_bytes",
    "layer_bytes",
    "head_retained_bytes",
    "head_transient_bytes",
    "head_forward_peak_bytes",
    "embedding_bytes",
    "head_kept_bytes",
    "head_seconds",
    "optimal_segment_length",
    "costs",
}


def test_fixed_plans() -> None:
    model = riftco.DecoderOnlyTransformer(small_config(), activation_checkpointing="segments:3")
    plan = model.activation_checkpointing_plan(BATCH, SEQ)
    assert set(plan) == PLAN_KEYS
    assert plan["policy"] == "segments:3"
    assert plan["summary"] == "segments:3 → block[0-2] block[3]"
    assert plan["per_block"] == ["block"] * 4
    assert plan["segments"] == [
        {"layers": [0, 3], "policy": "block"},
        {"layers": [3, 4], "policy": "block"},
    ]
    assert plan["segment_length"] == 3
    assert plan["predicted_peak_bytes"] is None and plan["predicted_step_seconds"] is None
    assert plan["measurement"] is None
    model.set_activation_checkpointing(["disabled", "selective", "block", "selective:q+k"])
    plan = model.activation_checkpointing_plan(BATCH, SEQ)
    assert plan["per_block"] == ["disabled", "selective:attention_ffn", "block", "selective:q+k"]
    assert [s["layers"] for s in plan["segments"]] == [[0, 1], [1, 2], [2, 3], [3, 4]]
    assert plan["segment_length"] is None
    model.set_activation_checkpointing("disabled")
    assert model.activation_checkpointing_plan(BATCH, SEQ)["per_block"] == ["disabled"] * 4


def check_measurement(plan: dict[str, Any], n_layers: int) -> dict[str, Any]:
    m = plan["measurement"]
    assert isinstance(m, dict) and set(m) == MEASUREMENT_KEYS
    assert (m["batch"], m["seq"], m["n_layers"]) == (BATCH, SEQ, n_layers)
    costs = {c["policy"]: c for c in m["costs"]}
    assert [c["policy"] for c in m["costs"]] == [
        "disabled",
        *(f"selective:{n}" for n in riftco.SELECTIVE_POLICIES),
        "block",
    ]
    for c in m["costs"]:
        assert set(c) == {
            "policy",
            "retained_bytes",
            "transient_bytes",
            "forward_peak_bytes",
            "seconds",
        }
        assert c["retained_bytes"] > 0 and c["transient_bytes"] >= 0 and c["seconds"] > 0
        # The forward holds at least what it leaves.
        assert c["forward_peak_bytes"] >= c["retained_bytes"]
    assert m["boundary_bytes"] == costs["block"]["retained_bytes"]
    assert m["layer_bytes"] == costs["disabled"]["retained_bytes"]
    # The boundary of a [batch, seq, d_model] float32 block input.
    assert m["boundary_bytes"] == BATCH * SEQ * SMALL["d_model"] * 4
    assert m["layer_bytes"] > m["boundary_bytes"]
    # The embedding output [batch, seq, d_model] float32 is part of what the head keeps.
    assert m["embedding_bytes"] == BATCH * SEQ * SMALL["d_model"] * 4
    assert m["head_retained_bytes"] >= m["embedding_bytes"]
    assert m["optimal_segment_length"] == pytest.approx(
        math.sqrt(n_layers * m["boundary_bytes"] / m["layer_bytes"])
    )
    assert isinstance(plan["predicted_peak_bytes"], int) and plan["predicted_peak_bytes"] > 0
    assert plan["predicted_step_seconds"] > 0
    json.dumps(plan)
    return m


@pytest.mark.parametrize("n_layers", [4, 16])
def test_auto_plan(n_layers: int) -> None:
    model = riftco.DecoderOnlyTransformer(
        small_config(n_layers=n_layers), activation_checkpointing="auto"
    )
    plan = model.activation_checkpointing_plan(BATCH, SEQ)
    assert set(plan) == PLAN_KEYS and plan["policy"] == "auto"
    m = check_measurement(plan, n_layers)
    k = plan["segment_length"]
    k_star = m["optimal_segment_length"]
    candidates = {min(max(f(k_star), 1), n_layers) for f in (math.floor, math.ceil)}
    assert k in candidates, (k, k_star)
    assert plan["per_block"] == ["block"] * n_layers
    assert plan["segments"][0] == {"layers": [0, k], "policy": "block"}
    assert plan["summary"].startswith("auto → block[") and "predicted peak" in plan["summary"]
    # Kept for the shape: asking again returns the same measurement.
    assert model.activation_checkpointing_plan(BATCH, SEQ) == plan


def test_budget_plan() -> None:
    model = riftco.DecoderOnlyTransformer(small_config())
    budget = int(smallest_peak(model) * 1.2)
    model.set_activation_checkpointing(activation_memory_budget=budget)
    plan = model.activation_checkpointing_plan(BATCH, SEQ)
    assert plan["policy"] == f"budget:{budget}"
    check_measurement(plan, 4)
    assert plan["predicted_peak_bytes"] <= budget
    assert plan["segment_length"] is None
    assert len(plan["per_block"]) == 4
    assert [s["policy"] for s in plan["segments"]] == plan["per_block"]
    assert plan["summary"].startswith(f"budget:{budget} → ")


@pytest.mark.parametrize(
    ("batch", "seq", "needle"),
    [
        (2**63, 8, "batch 9223372036854775808"),
        (2**200, 8, "batch = "),
        (2, 2**64, "seq = "),
        (True, 8, "not a bool"),
        (2, False, "not a bool"),
        (2.0, 8, "expected an int"),
        ("2", 8, "expected an int"),
    ],
    ids=repr,
)
def test_plan_shape_of_the_wrong_type_or_size_is_a_config_error(
    batch: Any, seq: Any, needle: str
) -> None:
    # An int too large for the platform or a bool was an OverflowError or silently batch 1.
    for policy in ("disabled", "block", "auto"):
        model = riftco.DecoderOnlyTransformer(small_config(), activation_checkpointing=policy)
        with pytest.raises(riftco.ConfigError, match=re.escape(needle)):
            model.activation_checkpointing_plan(batch, seq)


def test_plan_shape_whose_activations_cannot_exist_is_a_config_error() -> None:
    # max(d_model, d_ff, vocab) = 88 here: 2^47 bytes is 4·88·batch·seq at batch ≈ 2.5·10^10
    # for seq 16. Fixed policies used to return a plan for it; nothing is allocated here.
    model = riftco.DecoderOnlyTransformer(small_config(), activation_checkpointing="block")
    batch = 2**47 // (4 * 88 * 16) + 1
    with pytest.raises(riftco.ConfigError, match=r"above the bound of 140737488355328 bytes"):
        model.activation_checkpointing_plan(batch, 16)
    # The largest batch within the bound still plans (a fixed policy allocates nothing).
    assert model.activation_checkpointing_plan(batch - 1, 16)["per_block"] == ["block"] * 4


@pytest.mark.parametrize("n_layers", [-1, 0, 2**64, True, 2.0], ids=repr)
def test_parse_n_layers_of_the_wrong_type_or_size_is_a_config_error(n_layers: Any) -> None:
    with pytest.raises(riftco.ConfigError, match="n_layers"):
        riftco.parse_activation_checkpointing("segments:1", n_layers=n_layers)
    assert riftco.parse_activation_checkpointing("segments:1", n_layers=1) == "segments:1"


def test_spaces_around_policy_items_are_accepted() -> None:
    # Whole strings and list items are passed to the Rust parser unchanged, which trims them,
    # as it already did for the items of a comma-separated string.
    assert riftco.parse_activation_checkpointing(" block ") == "block"
    assert riftco.parse_activation_checkpointing([" block"] * 4, n_layers=4) == (
        "block,block,block,block"
    )
    model = riftco.DecoderOnlyTransformer(small_config(), activation_checkpointing=[" block"] * 4)
    assert model.activation_checkpointing == "block,block,block,block"
    assert (
        riftco.parse_activation_checkpointing("block, block ,block,block")
        == "block,block,block,block"
    )


def test_planning_does_not_reset_the_peak_counters() -> None:
    # The docstring used to say planning resets them; it does not: a peak reached before the
    # plan survives it, and the probes' own allocations count like any other.
    doc = riftco.DecoderOnlyTransformer.activation_checkpointing_plan.__doc__ or ""
    assert "resets the peak" not in doc and "does not reset the peak counters" in doc, doc
    model = riftco.DecoderOnlyTransformer(small_config(), activation_checkpointing="auto")
    big = riftco.Variable(np.zeros((1024, 1024), dtype=np.float32), requires_grad=True)
    before = riftco.memory_stats()["total"]["peak_bytes"]
    del big
    model.activation_checkpointing_plan(BATCH, SEQ)
    assert riftco.memory_stats()["total"]["peak_bytes"] >= before
