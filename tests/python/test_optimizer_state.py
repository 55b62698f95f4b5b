"""``Adam.state_dict()`` / ``load_state_dict()`` (PyTorch's shape): a run continued in fresh
objects from the weights and the optimizer's state dict is bitwise the uninterrupted run; a
state for other parameters is refused naming the first mismatch with nothing changed; with
PyTorch installed (optional), the same steps from the same state agree with ``torch.optim.AdamW``
loaded from riftco's state dict."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco


def model(lora: bool) -> riftco.DecoderOnlyTransformer:
    cfg = riftco.TransformerConfig(
        vocab_size=64, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=16, seed=5
    )
    m = riftco.DecoderOnlyTransformer(cfg, activation_checkpointing="block")
    if lora:
        m.enable_lora(rank=2, alpha=4.0, mlp=True, seed=1)
    return m


def batch(step: int) -> np.ndarray[Any, Any]:
    return (np.arange(2 * 9, dtype=np.int64).reshape(2, 9) * 7 + step) % 64


def train(
    m: riftco.DecoderOnlyTransformer, opt: riftco.Adam | riftco.AdamW, steps: range
) -> list[float]:
    losses = []
    for i in steps:
        opt.zero_grad()
        loss = m.loss(batch(i))
        loss.backward(retain_graph=False)
        opt.step()
        losses.append(loss.item())
    return losses


def weights(m: riftco.DecoderOnlyTransformer) -> list[np.ndarray[Any, Any]]:
    named = m.named_parameters() + (m.named_lora_parameters() if m.has_lora else [])
    return [p.numpy() for _, p in named]


@pytest.mark.parametrize("lora", [False, True])
def test_a_run_continued_from_a_state_dict_is_bitwise_the_uninterrupted_one(
    lora: bool, tmp_path: Path
) -> None:
    a = model(lora)
    opt_a = riftco.AdamW(a.parameters(), lr=1e-2)
    losses_a = train(a, opt_a, range(5))

    b = model(lora)
    opt_b = riftco.AdamW(b.parameters(), lr=1e-2)
    losses_b = train(b, opt_b, range(3))
    state = opt_b.state_dict()
    group = state["param_groups"][0]
    assert group["steps"] == 3 and group["lr"] == pytest.approx(1e-2)
    trainable = [i for i, p in enumerate(opt_b.parameters()) if p.requires_grad]
    assert sorted(state["state"]) == trainable
    first = state["state"][trainable[0]]
    assert first["step"] == 3 and first["exp_avg"].dtype == np.float32
    assert first["exp_avg"].shape == opt_b.parameters()[trainable[0]].shape

    # Fresh objects: the weights through files, the optimizer from its state dict.
    b.save(tmp_path / "model.safetensors")
    c = model(False)
    c.load_weights(tmp_path / "model.safetensors")
    if lora:  # the adapters come from their files
        b.save_lora(tmp_path / "adapters")
        c.load_lora(tmp_path / "adapters")
    opt_c = riftco.AdamW(c.parameters(), lr=0.5)
    opt_c.load_state_dict(copy.deepcopy(state))
    assert opt_c.lr == pytest.approx(1e-2) and opt_c.steps == 3
    losses_b += train(c, opt_c, range(3, 5))
    assert losses_a == losses_b
    for x, y in zip(weights(a), weights(c)):
        assert np.array_equal(x, y)


def test_a_state_for_other_parameters_is_refused_and_nothing_changes() -> None:
    m = model(False)
    opt = riftco.Adam(m.parameters(), lr=1e-2)
    train(m, opt, range(1))
    good = opt.state_dict()

    def refused(state: dict[str, Any], match: str, target: Any = opt) -> None:
        before = target.state_dict()
        with pytest.raises(riftco.ConfigError, match=match):
            target.load_state_dict(state)
        after = target.state_dict()
        assert after["param_groups"] == before["param_groups"]
        for k, v in before["state"].items():
            assert np.array_equal(after["state"][k]["exp_avg"], v["exp_avg"])

    lora = model(True)
    refused(good, "other parameters", riftco.Adam(lora.parameters(), lr=1e-2))
    s = copy.deepcopy(good)
    s["param_groups"][0]["param_names"][0] = "model.embed_tokens.wrong"
    refused(s, "wrong")
    s = copy.deepcopy(good)
    s["state"][1]["exp_avg"] = s["state"][1]["exp_avg"][:1]
    refused(s, "shape")
    s = copy.deepcopy(good)
    s["state"][2]["exp_avg_sq"].flat[3] = -1.0
    refused(s, "exp_avg_sq")
    s = copy.deepcopy(good)
    del s["state"][0]["step"]
    refused(s, "step")
    s = copy.deepcopy(good)
    s["param_groups"][0]["lr"] = -1.0
    refused(s, "lr")
    refused({"state": {}}, "param_groups")
    # Wrong types are named as written (strings quoted), never converted.
    s = copy.deepcopy(good)
    s["state"][0]["step"] = "5"
    refused(s, r"state\[0\] .* step = '5': expected a non-negative int")
    s = copy.deepcopy(good)
    s["state"][0]["step"] = True
    refused(s, "not a bool")
    s = copy.deepcopy(good)
    s["state"][0]["step"] = 2**64
    refused(s, "non-negative int")
    for bad_moment in (None, "1.5", True):
        s = copy.deepcopy(good)
        s["state"][0]["exp_avg"] = bad_moment
        refused(s, "expected an array")
    s = copy.deepcopy(good)
    s["param_groups"][0]["lr"] = "0.1"
    refused(s, "lr = '0.1'")
    opt.load_state_dict(good)


def test_a_step_count_at_the_maximum_is_refused_before_any_update() -> None:
    a = riftco.Variable(np.ones(3, np.float32), requires_grad=True, name="a")
    b = riftco.Variable(np.ones(3, np.float32), requires_grad=True, name="b")
    opt = riftco.Adam([a, b], lr=0.1)
    riftco.functional.sum(a * a + b * b).backward()
    opt.step()
    s = opt.state_dict()
    s["state"][1]["step"] = 2**64 - 1
    s["param_groups"][0]["steps"] = 2**64 - 1
    opt.load_state_dict(s)
    riftco.functional.sum(a * a + b * b).backward()
    before = (a.numpy().copy(), b.numpy().copy())
    with pytest.raises(riftco.ConfigError, match="u64::MAX"):
        opt.step()
    assert np.array_equal(a.numpy(), before[0]) and np.array_equal(b.numpy(), before[1])
    assert opt.steps == 2**64 - 1


def test_the_state_dict_loads_into_torch_adamw_where_installed() -> None:
    torch = pytest.importorskip(
        "torch", reason="PyTorch is optional and not installed: its AdamW is not compared"
    )
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    p = riftco.Variable(w0, requires_grad=True, name="w")
    opt = riftco.AdamW([p], lr=1e-2, weight_decay=0.1)
    grads = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(4)]
    for g in grads[:2]:
        opt.zero_grad()
        riftco.functional.sum(p * riftco.Variable(g)).backward()
        opt.step()
    state = opt.state_dict()
    tp = torch.nn.Parameter(torch.from_numpy(p.numpy().copy()))
    topt = torch.optim.AdamW([tp], lr=1e-2, weight_decay=0.1)
    s = state["state"][0]
    topt.load_state_dict(
        {
            "state": {
                0: {
                    "step": torch.tensor(float(s["step"])),
                    "exp_avg": torch.from_numpy(s["exp_avg"]),
                    "exp_avg_sq": torch.from_numpy(s["exp_avg_sq"]),
                }
            },
            "param_groups": [{**topt.state_dict()["param_groups"][0], "params": [0]}],
        }
    )
    for g in grads[2:]:
        opt.zero_grad()
        riftco.functional.sum(p * riftco.Variable(g)).backward()
        opt.step()
        topt.zero_grad()
        tp.grad = torch.from_numpy(g)
        topt.step()
    np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=0, atol=1e-6)
