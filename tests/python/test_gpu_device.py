"""The GPU backend from Python, on the adapter ``RIFTCO_TEST_GPU`` names (``"gpu"`` when unset;
``"vulkan"`` or ``"metal"`` to insist on one backend), the rule of the Rust GPU tests: with no
adapter every test here skips with the reason, except under ``CI=true`` (CI installs Mesa's
software Vulkan with ``scripts/gpu_setup.sh``), where it fails.

A tiny model (vocab 64, d_model 32, 2 heads, 2 layers, seq 8, batch 2) on the GPU against the
same model on the CPU: loss, every gradient and every parameter after one Adam step within
1e-4 of each tensor's largest magnitude (flash and materialized attention x no checkpointing
and block checkpointing x base and LoRA; Adam's eps is 1e-5, see ``LR, EPS``, and the GPU's
Adam is also checked against a float64 step on its own gradients), decode logits at every position, ``Variable.to``,
the device errors, ``riftco.devices()`` and ``riftco pretrain / post-train / generate
--device`` through the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco
import riftco.commands.info

GPU = os.environ.get("RIFTCO_TEST_GPU", "gpu")
TOL = 1e-4
# Adam's first step is lr * g / (|g| + eps) (bias-corrected m / sqrt(v) is g / |g|): for a
# gradient entry near 0 it turns the gradients' 1e-4 agreement into a difference of up to lr
# (entries of -1.03e-8 vs -1.04e-8, both well within tolerance, moved weights 2e-5 apart with
# the default eps 1e-8). eps = 1e-5 bounds that sensitivity at lr / eps per unit of gradient
# difference; the GPU's Adam kernel itself is checked on its own gradients (``adam_reference``).
LR, EPS = 1e-2, 1e-5


def adam(params: list[riftco.Variable]) -> riftco.Adam:
    return riftco.Adam(params, lr=LR, eps=EPS)


def adam_reference(param: npt.NDArray[Any], grad: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    """The first Adam step in float64: ``p - lr * g / (|g| + eps)`` (m and v bias-corrected)."""
    g = grad.astype(np.float64)
    out: npt.NDArray[np.float64] = param - LR * g / (np.abs(g) + EPS)
    return out
TINY: dict[str, Any] = dict(
    vocab_size=64, d_model=32, n_heads=2, n_layers=2, d_ff=48, max_seq_len=16, seed=3
)
ROOT = Path(__file__).resolve().parents[2]


def _open_gpu() -> tuple[str | None, str]:
    """The riftco device ``GPU`` names (``None`` when this machine has no adapter) and why not;
    fails under ``CI=true`` and for a name that is not a GPU."""
    if GPU not in ("gpu", "vulkan", "metal"):
        pytest.fail(f"RIFTCO_TEST_GPU={GPU!r}: expected 'gpu', 'vulkan' or 'metal'")
    entry = next(d for d in riftco.devices() if d["device"] == GPU)
    if entry["available"]:
        return str(entry["resolved"]), ""
    if os.environ.get("CI") == "true":
        pytest.fail(
            f"CI=true and no {GPU} adapter (install mesa-vulkan-drivers: scripts/gpu_setup.sh): "
            f"{entry['reason']}"
        )
    return None, str(entry["reason"])


@pytest.fixture(scope="module")
def gpu() -> str:
    device, reason = _open_gpu()
    if device is None:
        pytest.skip(f"no GPU ({reason}); set CI=true to make this a failure")
    return device


def tokens(batch: int, seq_plus_one: int, seed: int = 7) -> npt.NDArray[np.int64]:
    return np.random.default_rng(seed).integers(0, 64, size=(batch, seq_plus_one))


def model(attention: str, policy: str, lora: bool) -> riftco.DecoderOnlyTransformer:
    m = riftco.DecoderOnlyTransformer(
        riftco.TransformerConfig(**TINY), attention=attention, activation_checkpointing=policy
    )
    if lora:
        m.enable_lora(rank=4, seed=1)
    return m


def assert_close(what: str, got: npt.NDArray[Any], want: npt.NDArray[Any]) -> None:
    """``|got - want| <= 1e-4 * max|want|`` element-wise (a floor of 1e-6 for an all-zero
    tensor)."""
    assert got.shape == want.shape, what
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-6)
    err = float(np.abs(got.astype(np.float64) - want).max(initial=0.0))
    assert err <= TOL * scale, f"{what}: max |gpu - cpu| {err:.3g} > {TOL} * {scale:.3g}"


@pytest.mark.parametrize("lora", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("policy", ["disabled", "block"])
@pytest.mark.parametrize("attention", ["flash", "materialized"])
def test_a_train_step_on_the_gpu_matches_the_cpu(
    gpu: str, attention: str, policy: str, lora: bool
) -> None:
    cpu, dev = model(attention, policy, lora), model(attention, policy, lora).to(GPU)
    assert dev.device == gpu and cpu.device == "cpu"
    # Optimizers built after the move hold their moments on the parameters' device.
    opt_cpu, opt_dev = adam(cpu.parameters()), adam(dev.parameters())
    block = tokens(2, 9)
    lc, ld = cpu.loss(block), dev.loss(block)
    assert ld.device == gpu
    assert_close("loss", ld.numpy(), lc.numpy())
    lc.backward()
    ld.backward()
    named = list(zip(cpu.named_parameters(), dev.named_parameters(), strict=True))
    assert len(named) == (len(cpu.named_parameters()))
    for (name, pc), (_, pd) in named:
        assert pd.device == gpu, name
        gc, gd = pc.grad, pd.grad
        if not pc.requires_grad:  # a base weight frozen by LoRA
            assert gc is None and gd is None, name
            continue
        assert gc is not None and gd is not None, name
        assert_close(f"grad {name}", gd, gc)
    before = {name: (pd.numpy(), pd.grad) for (name, _), (_, pd) in named}
    opt_cpu.step()
    opt_dev.step()
    for (name, pc), (_, pd) in named:
        assert_close(f"{name} after Adam", pd.numpy(), pc.numpy())
        p0, g = before[name]
        if g is not None:  # the GPU's Adam on the GPU's own gradient
            want = adam_reference(p0, g)
            err = float(np.abs(pd.numpy() - want).max())
            assert err <= 1e-5 * float(np.abs(want).max()), f"{name}: Adam kernel off by {err}"


def test_checkpointed_and_plain_runs_on_the_gpu_are_bitwise_equal(gpu: str) -> None:
    plain, block = model("flash", "disabled", False).to(GPU), model("flash", "block", False).to(GPU)
    batch = tokens(2, 9, seed=11)
    lp, lb = plain.loss(batch), block.loss(batch)
    assert lp.numpy().tobytes() == lb.numpy().tobytes()
    lp.backward()
    lb.backward()
    for (name, pp), (_, pb) in zip(plain.named_parameters(), block.named_parameters(), strict=True):
        gp, gb = pp.grad, pb.grad
        assert gp is not None and gb is not None, name
        assert gp.tobytes() == gb.tobytes(), name


def test_decoding_on_the_gpu_matches_the_cpu_at_every_position(gpu: str) -> None:
    cpu, dev = model("flash", "disabled", False), model("flash", "disabled", False).to(GPU)
    sc, sd = cpu.decode_session(), dev.decode_session()
    for position, t in enumerate(tokens(1, 12, seed=2)[0]):
        got, want = sd.decode_token(int(t)), sc.decode_token(int(t))
        assert_close(f"logits at position {position}", got, want)
    prompt = b"\x01\x02\x03"
    small = dict(TINY, vocab_size=256)
    cpu_b = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**small))
    dev_b = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**small)).to(GPU)
    # Greedy: the same argmax at every step (the logits agree within 1e-4 above).
    assert riftco.generate(dev_b, prompt, 8, temperature=0.0) == riftco.generate(
        cpu_b, prompt, 8, temperature=0.0
    )


def test_variable_to_round_trips_bitwise_and_keeps_requires_grad(gpu: str) -> None:
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    w = riftco.Variable(x, requires_grad=True, name="w")
    g = w.to(GPU)
    assert g.device == gpu and g.requires_grad and g.is_leaf and w.device == "cpu"
    assert g.to(gpu) is g  # already there: the same Variable, as in PyTorch
    back = g.to("cpu")
    assert back.device == "cpu" and back.numpy().tobytes() == x.tobytes()
    assert g.numpy().tobytes() == x.tobytes()
    assert not riftco.Variable(x).to(GPU).requires_grad
    assert riftco.functional.sum(g).item() == pytest.approx(float(x.sum()), rel=1e-5)
    # An op result moves as a graph node: the gradient flows back to the CPU leaf.
    y = (w * 2.0).to(GPU)
    assert not y.is_leaf
    riftco.functional.sum(y * y).backward()
    assert w.grad is not None
    np.testing.assert_allclose(w.grad, 8.0 * x, rtol=1e-5)


def test_an_nn_module_moved_to_the_gpu_trains_like_on_the_cpu(gpu: str) -> None:
    def mlp() -> riftco.nn.Sequential:
        riftco.manual_seed(4)
        nn = riftco.nn
        return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.RMSNorm(16), nn.Linear(16, 3))

    cpu, dev = mlp(), mlp().to(GPU)
    assert {p.device for p in dev.parameters()} == {gpu}
    x = np.random.default_rng(3).standard_normal((5, 8)).astype(np.float32)
    lc = riftco.functional.sum(cpu(riftco.Variable(x)) ** 2)
    ld = riftco.functional.sum(dev(riftco.Variable(x).to(GPU)) ** 2)
    assert_close("loss", ld.numpy(), lc.numpy())
    lc.backward()
    ld.backward()
    opt_cpu, opt_dev = adam(list(cpu.parameters())), adam(list(dev.parameters()))
    for (name, pc), (_, pd) in zip(cpu.named_parameters(), dev.named_parameters(), strict=True):
        assert pc.grad is not None and pd.grad is not None, name
        assert_close(f"grad {name}", pd.grad, pc.grad)
    opt_cpu.step()
    opt_dev.step()
    for (name, pc), (_, pd) in zip(cpu.named_parameters(), dev.named_parameters(), strict=True):
        assert_close(f"{name} after Adam", pd.numpy(), pc.numpy())


def test_device_errors_name_the_values(gpu: str) -> None:
    m = model("flash", "disabled", False)
    with pytest.raises(riftco.ConfigError, match='"tpu".*"vulkan"'):
        m.to("tpu")
    assert m.device == "cpu"
    with pytest.raises(riftco.ConfigError, match='"tpu"'):
        riftco.Variable(np.ones(2, np.float32)).to("tpu")
    m.to(GPU)
    w = dict(m.named_parameters())["model.layers.0.self_attn.q_proj.weight"]
    x = riftco.Variable(np.ones((2, 32), np.float32))
    with pytest.raises(riftco.DeviceMismatchError, match=f"different devices.*cpu.*{gpu}"):
        riftco.functional.linear(x, w)
    loss = m.loss(tokens(1, 5))
    m.to("cpu")  # a transfer under a live graph: the graph is stale
    with pytest.raises(riftco.StaleGraphError):
        loss.backward()


def test_devices_lists_every_name_with_its_state(gpu: str) -> None:
    entries = {d["device"]: d for d in riftco.devices()}
    assert list(entries) == list(riftco.DEVICES) == ["cpu", "vulkan", "metal", "gpu"]
    assert entries["cpu"]["available"] and entries["cpu"]["adapter"] is None
    assert entries["gpu"]["available"] and entries["gpu"]["resolved"] == gpu
    assert entries[gpu]["adapter"] == entries["gpu"]["adapter"] != ""
    for name, d in entries.items():
        assert d["available"] == ("reason" not in d), name
        if not d["available"]:
            assert name in d["reason"], d["reason"]
    info = riftco.commands.info.collect()
    assert [d["device"] for d in info["devices"]] == list(riftco.DEVICES)


def riftco_cmd(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riftco", *map(str, args)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )


def test_synchronize_waits_for_the_queued_kernels(gpu: str) -> None:
    m = model("flash", "disabled", False).to(GPU)
    loss = m.loss(tokens(2, 9))
    loss.backward()
    # Queued, not waited for: synchronize (by name and for every opened device) returns once the
    # GPU finished, and the values read afterwards are those of a finished step.
    riftco.synchronize(GPU)
    riftco.synchronize(gpu)
    riftco.synchronize()
    assert np.isfinite(loss.item())
    grads = [p.grad for p in m.parameters()]
    assert all(g is not None and np.isfinite(g).all() for g in grads)


def test_the_commands_train_and_sample_on_the_gpu(gpu: str, tmp_path: Path) -> None:
    data = tmp_path / "text.txt"
    data.write_bytes(bytes(riftco.default_corpus().tokens[:4_000]))
    tiny = ["--d-model", "32", "--n-heads", "2", "--n-layers", "2", "--d-ff", "48"]
    train = ["--batch-size", "2", "--seq-len", "8", "--warmup-steps", "1", "--no-progress"]
    out = tmp_path / "pre"
    r = riftco_cmd(
        "pretrain", "--device", GPU, "--steps", "2", "--data", data, "--out", out,
        "--no-plots", "--sample-tokens", "4", *tiny, *train,
    )
    assert r.returncode == 0, r.stderr
    # The log names the device opened ("gpu" is vulkan or metal).
    assert f"; device {gpu}" in r.stderr, r.stderr
    meta = json.loads((out / riftco.METADATA_FILE).read_text())
    assert meta["device"] == gpu and meta["training_config"]["device"] == GPU
    assert len(meta["losses"]) == 2 and all(np.isfinite(meta["losses"]))
    post = tmp_path / "post"
    r = riftco_cmd(
        "post-train", "--device", GPU, "--model", out, "--steps", "1", "--data", data,
        "--out", post, "--no-plots", "--sample-tokens", "4", *train,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads((post / riftco.METADATA_FILE).read_text())["device"] == gpu
    r = riftco_cmd("generate", "--device", GPU, "--model", post, "--sample-tokens", "4", "ab")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ab")


def test_a_failed_post_training_setup_moves_the_model_back(gpu: str, tmp_path: Path) -> None:
    m = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**dict(TINY, vocab_size=256)))
    corpus = riftco.Corpus(riftco.default_corpus().tokens[:4_000], description="tiny")
    (tmp_path / "file").write_bytes(b"")
    cfg = riftco.PostTrainingConfig(device=GPU, steps=1, batch_size=2, seq_len=8)
    with pytest.raises(riftco.stages.OutputDirError):
        riftco.run_post_training(m, cfg, corpus, tmp_path / "file" / "out", progress=False)
    assert m.device == "cpu"  # moved back (the adapters already added stay, as documented)


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS has Metal")
def test_a_missing_gpu_is_one_error_line_before_any_folder_exists(tmp_path: Path) -> None:
    out = tmp_path / "never"
    r = riftco_cmd("pretrain", "--device", "metal", "--steps", "1", "--out", out)
    assert r.returncode == 2, (r.stdout, r.stderr)
    # Mesa's software Vulkan may add its XDG_RUNTIME_DIR notice while adapters are listed.
    errors = [line for line in r.stderr.splitlines() if "XDG_RUNTIME_DIR" not in line]
    assert len(errors) == 1 and errors[0].startswith("riftco pretrain: error:"), r.stderr
    assert "no metal adapter found" in errors[0] and "found:" in errors[0], errors[0]
    assert not out.exists()


def test_a_stage_config_names_a_bad_device() -> None:
    with pytest.raises(riftco.ConfigError, match="device.*'tpu'"):
        riftco.PretrainingConfig(device="tpu")


def test_the_masked_loss_on_the_gpu_matches_the_cpu(gpu: str) -> None:
    # labels with -100 (instruction tuning's prompt positions) go through the embedding gather
    # and the chunked head on the device as on the CPU.
    block = tokens(2, 9)
    labels = block.copy()
    labels[0, :5] = -100
    labels[1, 3] = -100
    cpu, dev = model("flash", "block", True), model("flash", "block", True).to(GPU)
    losses = []
    for m in (cpu, dev):
        loss = m.loss(block, labels=labels)
        loss.backward()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) <= TOL * abs(losses[0])
    for (name, p), (_, q) in zip(cpu.named_lora_parameters(), dev.named_lora_parameters(),
                                 strict=True):
        assert p.grad is not None and q.grad is not None, name
        assert_close(name, np.asarray(q.grad), np.asarray(p.grad))
