"""The device seam from Python: a model moved to the mirror test backend ("privateuseone",
CPU kernels behind the backend trait, buffers no CPU kernel can read) trains and decodes
bitwise like the same model on "cpu"; memory is counted per device; host access (numpy) is an
explicit copy; mixing devices is a clear error."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import riftco

TINY: dict[str, Any] = dict(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_seq_len=16)


def tokens(batch: int, seq_plus_one: int) -> np.ndarray:
    return np.random.default_rng(5).integers(0, 64, size=(batch, seq_plus_one))


def model(attention: str, policy: str) -> riftco.DecoderOnlyTransformer:
    return riftco.DecoderOnlyTransformer(
        riftco.TransformerConfig(**TINY), attention=attention, activation_checkpointing=policy
    )


@pytest.mark.parametrize("attention", ["flash", "materialized"])
@pytest.mark.parametrize("policy", ["disabled", "block"])
def test_training_on_the_mirror_backend_is_bitwise_the_cpu(attention: str, policy: str) -> None:
    riftco._native._install_mirror_backend()
    cpu = model(attention, policy)
    dev = model(attention, policy).to("privateuseone")
    assert dev.device == "privateuseone" and cpu.device == "cpu"
    opt_cpu = riftco.Adam(cpu.parameters(), lr=1e-2)
    opt_dev = riftco.Adam(dev.parameters(), lr=1e-2)
    block = tokens(2, 9)
    for _ in range(2):
        lc, ld = cpu.loss(block), dev.loss(block)
        assert lc.numpy().tobytes() == ld.numpy().tobytes()
        lc.backward()
        ld.backward()
        for (name, pc), (_, pd) in zip(cpu.named_parameters(), dev.named_parameters()):
            gc, gd = pc.grad, pd.grad
            assert gc is not None and gd is not None, name
            assert gc.tobytes() == gd.tobytes(), name
        opt_cpu.step()
        opt_dev.step()
    for (name, pc), (_, pd) in zip(cpu.named_parameters(), dev.named_parameters()):
        assert pc.numpy().tobytes() == pd.numpy().tobytes(), name
    sc, sd = cpu.decode_session(), dev.decode_session()
    for t in [3, 1, 4, 1, 5]:
        assert sc.decode_token(t).tobytes() == sd.decode_token(t).tobytes()


def test_memory_is_counted_per_device() -> None:
    riftco._native._install_mirror_backend()
    before = riftco.memory_stats(device="privateuseone")["parameter"]["current_bytes"]
    cpu_before = riftco.memory_stats()["parameter"]["current_bytes"]
    m = model("flash", "disabled")
    n_bytes = 4 * sum(p.numpy().size for _, p in m.named_parameters())
    assert riftco.memory_stats()["parameter"]["current_bytes"] - cpu_before == n_bytes
    m.to("privateuseone")
    assert riftco.memory_stats(device="privateuseone")["parameter"]["current_bytes"] - before == n_bytes
    assert riftco.memory_stats(device="cpu")["parameter"]["current_bytes"] == cpu_before
    with pytest.raises(riftco.ConfigError, match='"tpu"'):
        riftco.memory_stats(device="tpu")


def test_a_graph_recorded_before_the_move_is_stale_and_mixing_devices_is_an_error() -> None:
    riftco._native._install_mirror_backend()
    m = model("flash", "block")
    loss = m.loss(tokens(1, 5))
    m.to("privateuseone")
    with pytest.raises(riftco.StaleGraphError):
        loss.backward()
    m.loss(tokens(1, 5)).backward()  # a fresh graph on the new device works
    x = riftco.Variable(np.ones((2, 32), np.float32))
    w = dict(m.named_parameters())["model.layers.0.self_attn.q_proj.weight"]
    with pytest.raises(riftco.RiftcoError, match="different devices.*cpu.*privateuseone"):
        riftco.functional.linear(x, w)


def test_lora_on_a_moved_model_lives_on_its_device_and_repr_names_the_device() -> None:
    riftco._native._install_mirror_backend()
    cpu = model("flash", "block")
    dev = model("flash", "block").to("privateuseone")
    assert 'device="privateuseone"' in repr(dev) and 'device="cpu"' in repr(cpu)
    before = riftco.memory_stats()["parameter"]["current_bytes"]
    cpu.enable_lora(rank=4)
    after_cpu = riftco.memory_stats()["parameter"]["current_bytes"]
    dev.enable_lora(rank=4)
    # The device model's adapters took no host memory (the CPU model's did).
    assert riftco.memory_stats()["parameter"]["current_bytes"] == after_cpu > before
    block = tokens(2, 9)
    assert cpu.loss(block).numpy().tobytes() == dev.loss(block).numpy().tobytes()


def test_variables_report_their_device_and_copies_of_trainable_ones_are_parameters() -> None:
    riftco._native._install_mirror_backend()
    m = model("flash", "disabled").to("privateuseone")
    w = dict(m.named_parameters())["model.norm.weight"]
    assert w.device == "privateuseone"
    assert riftco.Variable(np.ones(3, np.float32)).device == "cpu"
    loss = m.loss(tokens(1, 5))
    assert loss.device == "privateuseone"
    before = riftco.memory_stats(device="privateuseone")
    copy = riftco.Variable(w, requires_grad=True)
    after = riftco.memory_stats(device="privateuseone")
    assert copy.device == "privateuseone"
    n = 4 * w.numpy().size
    assert after["parameter"]["current_bytes"] - before["parameter"]["current_bytes"] == n
    assert after["workspace"]["current_bytes"] == before["workspace"]["current_bytes"]


def test_variable_to_copies_leaves_and_op_results_across_devices() -> None:
    riftco._native._install_mirror_backend()
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    w = riftco.Variable(x, requires_grad=True, name="w")
    assert w.to("cpu") is w and w.to("CPU") is w
    d = w.to("privateuseone")
    assert (d.device, d.requires_grad, d.is_leaf, w.device) == ("privateuseone", True, True, "cpu")
    assert d.to("cpu").numpy().tobytes() == x.tobytes() == d.numpy().tobytes()
    # An op result is a graph node: its backward copies the gradient back to the CPU leaf.
    y = (w * 3.0).to("privateuseone")
    assert y.device == "privateuseone" and not y.is_leaf
    riftco.functional.sum(y * y).backward()
    assert w.grad is not None
    np.testing.assert_allclose(w.grad, 18.0 * x, rtol=1e-6)
    with pytest.raises(riftco.ConfigError, match='"tpu".*"vulkan"'):
        w.to("tpu")


def test_module_to_moves_every_leaf_and_keeps_shared_ones_shared() -> None:
    riftco._native._install_mirror_backend()
    riftco.manual_seed(3)
    cpu = riftco.nn.Sequential(riftco.nn.Linear(4, 5), riftco.nn.ReLU(), riftco.nn.Linear(5, 2))
    riftco.manual_seed(3)
    dev = riftco.nn.Sequential(riftco.nn.Linear(4, 5), riftco.nn.ReLU(), riftco.nn.Linear(5, 2))
    last = dev[2]
    assert isinstance(last, riftco.nn.Linear)
    tied = riftco.nn.Linear(5, 2)
    tied.weight = last.weight  # one leaf in two modules
    holder = riftco.nn.ModuleList([dev, tied])
    assert holder.to("privateuseone") is holder
    assert {p.device for p in dev.parameters()} == {"privateuseone"}
    assert tied.weight is last.weight
    with pytest.raises(riftco.ConfigError):
        holder.to("tpu")
    assert {p.device for p in holder.parameters()} == {"privateuseone"}
    x = riftco.Variable(np.ones((3, 4), np.float32))
    out_cpu = cpu(x)
    out_dev = dev(x.to("privateuseone"))
    assert out_cpu.numpy().tobytes() == out_dev.numpy().tobytes()


def test_module_to_moves_the_leaves_in_place_so_references_and_optimizers_see_it() -> None:
    """PyTorch's ``module.to`` keeps the Parameter objects: a reference taken before the move
    and an optimizer built before it hold the moved leaves. Adam's moments stay on the old
    device, so its next step is a DeviceMismatchError, never a silent step of stale copies."""
    riftco._native._install_mirror_backend()
    lin = riftco.nn.Linear(3, 3)
    weight = lin.weight
    opt = riftco.Adam(lin.parameters(), lr=0.1)
    lin.to("privateuseone")
    assert lin.weight is weight and weight.device == "privateuseone"
    x = riftco.Variable(np.ones((2, 3), np.float32)).to("privateuseone")
    loss = (lin(x) ** 2).mean()
    loss.backward()
    assert weight.grad is not None  # a NumPy copy of the gradient
    with pytest.raises(riftco.DeviceMismatchError):
        opt.step()
    fresh = riftco.Adam(lin.parameters(), lr=0.1)
    before = weight.numpy().copy()
    fresh.step()
    assert not np.array_equal(before, weight.numpy())
    # Back to the CPU in place, the gradient with it.
    lin.to("cpu")
    assert weight.device == "cpu"
    out = lin(riftco.Variable(np.ones((2, 3), np.float32)))  # runs on the CPU again
    assert out.device == "cpu"


def test_module_to_a_bad_device_moves_nothing() -> None:
    riftco._native._install_mirror_backend()
    lin = riftco.nn.Linear(2, 2)
    with pytest.raises(riftco.ConfigError, match="tpu"):
        lin.to("tpu")
    assert {p.device for p in lin.parameters()} == {"cpu"}


def test_device_names_are_case_insensitive_in_configs_and_on_the_command_line() -> None:
    import argparse

    from riftco.cli import add_device_argument
    from riftco.configs import PretrainingConfig

    assert PretrainingConfig(device="CPU").device == "CPU"  # accepted as model.to accepts it
    with pytest.raises(riftco.ConfigError, match="'tpu'"):
        PretrainingConfig(device="tpu")
    p = argparse.ArgumentParser()
    add_device_argument(p)
    assert p.parse_args(["--device", "Vulkan"]).device == "vulkan"


def test_synchronize_accepts_every_device_name_and_refuses_unknown_ones() -> None:
    # The CPU computes when called and the mirror backend too: nothing to wait for, but every
    # spelling is checked like model.to's.
    riftco._native._install_mirror_backend()
    for name in [None, "cpu", "CPU", "privateuseone", "vulkan", "metal", "gpu"]:
        riftco.synchronize(name)  # returns None; raises on a bad name
    with pytest.raises(riftco.ConfigError, match='"cuda"') as e:
        riftco.synchronize("cuda")
    assert '"vulkan"' in str(e.value) and "Device::parse" not in str(e.value)
