"""``riftco.nn``: parameter discovery and PyTorch's dotted names, ``train()``/``eval()``
propagation, ``Linear`` initialisation bounds and forward against NumPy, reproducible
initialisation under ``manual_seed``, ``Embedding``/``RMSNorm``/``Dropout``, the containers,
``riftco.optim`` with ``module.parameters()``, and a checkpointed 24-block MLP whose gradients
equal the plain one bit for bit."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

import riftco
import riftco.functional as F
from riftco import nn, optim

F32 = npt.NDArray[np.float32]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "checkpoint_mlp.py"


class Block(nn.Module):
    """Linear -> ReLU -> Linear, the classic checkpointing block."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: riftco.Variable) -> riftco.Variable:
        return self.fc2(self.act(self.fc1(x)))


class MLP(nn.Module):
    def __init__(self, d: int, n_blocks: int, use_checkpoint: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n_blocks)])
        self.norm = nn.RMSNorm(d)
        self.drop = nn.Dropout(0.1)
        self.use_checkpoint = use_checkpoint

    def forward(self, x: riftco.Variable) -> riftco.Variable:
        for b in self.blocks:
            x = riftco.checkpoint(b, x) if self.use_checkpoint else b(x)
        return self.norm(x)


def test_named_parameters_use_pytorchs_dotted_names_and_order() -> None:
    m = MLP(4, 2, use_checkpoint=False)
    names = [n for n, _ in m.named_parameters()]
    assert names == [
        "blocks.0.fc1.weight",
        "blocks.0.fc1.bias",
        "blocks.0.fc2.weight",
        "blocks.0.fc2.bias",
        "blocks.1.fc1.weight",
        "blocks.1.fc1.bias",
        "blocks.1.fc2.weight",
        "blocks.1.fc2.bias",
        "norm.weight",
    ]
    assert len(list(m.parameters())) == 9
    assert [type(c).__name__ for c in m.children()] == ["ModuleList", "RMSNorm", "Dropout"]
    assert len(list(m.modules())) == 1 + 1 + 2 * 4 + 2  # self, list, 2 x (block+3), norm, drop
    shapes = {n: p.shape for n, p in m.named_parameters()}
    assert shapes["blocks.0.fc1.weight"] == (8, 4) and shapes["blocks.0.fc1.bias"] == (8,)


def test_frozen_variables_are_not_parameters_and_shared_ones_are_listed_once() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3, bias=False)
            self.b = nn.Linear(3, 3, bias=False)
            self.b.weight = self.a.weight  # tied
            self.mask = riftco.Variable(np.ones(3))  # frozen

    t = Tied()
    assert [n for n, _ in t.named_parameters()] == ["a.weight"]
    assert [n for n, _ in t.named_variables()] == ["mask", "a.weight"]


def test_train_and_eval_propagate_to_every_descendant() -> None:
    m = MLP(4, 3, use_checkpoint=False)
    assert all(x.training for x in m.modules())
    assert m.eval() is m
    assert not any(x.training for x in m.modules())
    m.blocks[1].train()
    assert m.blocks[1].training and not m.blocks[0].training
    m.train()
    assert all(x.training for x in m.modules())
    with pytest.raises(TypeError, match="bool"):
        m.train(1)  # type: ignore[arg-type]


def test_linear_init_is_within_pytorchs_bounds_and_reproducible() -> None:
    riftco.manual_seed(7)
    a = nn.Linear(50, 30)
    riftco.manual_seed(7)
    b = nn.Linear(50, 30)
    c = nn.Linear(50, 30)
    bound = 1 / math.sqrt(50)
    for p in (a.weight, a.bias):
        assert p is not None and p.requires_grad and p.is_leaf
        v = p.numpy()
        assert v.min() >= -bound and v.max() <= bound
        assert v.max() - v.min() > bound  # spread over the range, not a constant
    assert a.bias is not None and b.bias is not None and c.bias is not None
    np.testing.assert_array_equal(a.weight.numpy(), b.weight.numpy())
    np.testing.assert_array_equal(a.bias.numpy(), b.bias.numpy())
    assert not np.array_equal(a.weight.numpy(), c.weight.numpy())
    assert abs(float(a.weight.numpy().mean())) < 0.2 * bound
    assert riftco.memory_stats()["parameter"]["current_bytes"] >= 4 * (50 * 30 + 30)


def test_linear_forward_matches_numpy() -> None:
    riftco.manual_seed(1)
    lin = nn.Linear(5, 3)
    x = np.random.default_rng(0).standard_normal((2, 4, 5)).astype(np.float32)
    assert lin.bias is not None
    want = x.astype(np.float64) @ lin.weight.numpy().T.astype(np.float64) + lin.bias.numpy()
    got = lin(riftco.Variable(x)).numpy()
    assert got.shape == (2, 4, 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    nobias = nn.Linear(5, 3, bias=False)
    assert nobias.bias is None and [n for n, _ in nobias.named_parameters()] == ["weight"]
    np.testing.assert_allclose(
        nobias(riftco.Variable(x)).numpy(), x @ nobias.weight.numpy().T, rtol=1e-5, atol=1e-5
    )
    with pytest.raises(riftco.ShapeError):
        lin(riftco.Variable(np.ones((2, 4))))
    with pytest.raises(riftco.ConfigError, match="in_features"):
        nn.Linear(0, 3)


def test_embedding_rmsnorm_dropout_and_activations() -> None:
    riftco.manual_seed(2)
    emb = nn.Embedding(10, 4)
    w = emb.weight.numpy()
    assert 0.5 < float(w.std()) < 1.5  # N(0, 1)
    ids = np.array([[1, 9], [0, 1]])
    out = emb(ids)
    assert out.shape == (2, 2, 4)
    np.testing.assert_array_equal(out.numpy(), w[ids])
    F.sum(out).backward()
    g = emb.weight.grad
    assert g is not None and g[1].tolist() == [2.0] * 4 and g[5].tolist() == [0.0] * 4
    with pytest.raises(riftco.TokenError, match="10"):
        emb(np.array([10]))

    norm = nn.RMSNorm(4, eps=1e-6)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(norm(riftco.Variable(x)).numpy(), want, rtol=1e-5, atol=1e-6)

    drop = nn.Dropout(0.5)
    big = riftco.Variable(np.ones((1000,)))
    kept = drop(big).numpy()
    assert set(np.unique(kept).tolist()) == {0.0, 2.0}
    drop.eval()
    np.testing.assert_array_equal(drop(big).numpy(), big.numpy())
    with pytest.raises(riftco.ConfigError, match="1.5"):
        nn.Dropout(1.5)

    xv = riftco.Variable(x)
    np.testing.assert_array_equal(nn.ReLU()(xv).numpy(), np.maximum(x, 0))
    np.testing.assert_array_equal(nn.SiLU()(xv).numpy(), F.silu(xv).numpy())
    assert nn.GELU()(xv).shape == (3, 4)


def test_sequential_and_module_list() -> None:
    seq = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert len(seq) == 3 and isinstance(seq[1], nn.ReLU) and len(seq[:2]) == 2
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    x = riftco.Variable(np.ones((5, 3)))
    np.testing.assert_array_equal(seq(x).numpy(), seq[2](seq[1](seq[0](x))).numpy())
    ml = nn.ModuleList().append(nn.ReLU()).extend([nn.SiLU()])
    assert [type(m).__name__ for m in ml] == ["ReLU", "SiLU"]
    with pytest.raises(TypeError, match="item 0 must be a riftco.nn.Module"):
        nn.Sequential(3)  # type: ignore[arg-type]
    r = repr(seq)
    assert "(0): Linear(in_features=3, out_features=4, bias=True)" in r and "(1): ReLU()" in r
    with pytest.raises(NotImplementedError, match="Module does not define forward"):
        nn.Module()(x)


def test_optimizers_take_module_parameters_as_a_generator() -> None:
    riftco.manual_seed(3)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = optim.AdamW(m.parameters(), lr=1e-2)
    assert optim.Adam is riftco.Adam and len(opt.parameters()) == 4
    x = riftco.Variable(np.random.default_rng(0).standard_normal((8, 3)))
    first = m[0]
    assert isinstance(first, nn.Linear)
    before = first.weight.numpy()
    loss = F.sum(m(x))
    loss.backward()
    opt.step()
    assert not np.array_equal(first.weight.numpy(), before)
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    with pytest.raises(TypeError, match=r"params\[1\] must be a riftco.Variable; got int"):
        optim.Adam(iter([first.weight, 3]))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a str"):
        optim.Adam("weights")  # type: ignore[arg-type]


def test_checkpointed_24_block_mlp_gradients_equal_the_plain_ones_bitwise() -> None:
    riftco.manual_seed(0)
    plain = MLP(16, 24, use_checkpoint=False)
    riftco.manual_seed(0)
    ckpt = MLP(16, 24, use_checkpoint=True)
    for (n1, p1), (n2, p2) in zip(plain.named_parameters(), ckpt.named_parameters()):
        assert n1 == n2
        np.testing.assert_array_equal(p1.numpy(), p2.numpy())
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    xs = [riftco.Variable(x, requires_grad=True) for _ in range(2)]
    outs = [plain(xs[0]), ckpt(xs[1])]
    np.testing.assert_array_equal(outs[0].numpy(), outs[1].numpy())
    for o in outs:
        F.sum(o).backward()
    np.testing.assert_array_equal(xs[0].grad, xs[1].grad)
    for (name, p1), (_, p2) in zip(plain.named_parameters(), ckpt.named_parameters()):
        assert p1.grad is not None, name
        np.testing.assert_array_equal(p1.grad, p2.grad, err_msg=name)


def test_the_checkpoint_mlp_example_runs_and_reports_bitwise_gradients(tmp_path: Path) -> None:
    out = tmp_path / "table.md"
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--d", "16", "--batch", "4", "--blocks", "4"]
        + ["--depths", "4,9", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=EXAMPLE.parents[1],
    )
    assert r.returncode == 0, r.stderr
    assert "output shape: (4, 16)" in r.stdout
    assert "gradients bitwise equal to the plain run: True" in r.stdout
    assert "DIFFERENT" not in r.stdout
    table = out.read_text()
    assert "| 4 | 2 |" in table and "| 9 | 3 |" in table
    pattern = r"peak activation memory [^:]*: [0-9.]+ MiB \(([0-9]+) bytes\)"
    peaks = [int(v) for v in re.findall(pattern, r.stdout)]
    assert len(peaks) == 2 and peaks[1] < peaks[0]  # checkpointing keeps less


def test_uniform_and_normal_draws_are_reproducible_and_validated() -> None:
    riftco.manual_seed(11)
    a, n = riftco.uniform([1000], -2.0, 3.0), riftco.normal([4000], 1.0, 2.0, requires_grad=True)
    state = riftco.get_rng_state()
    assert state == (11, 2)  # one generator block per draw
    riftco.manual_seed(11)
    np.testing.assert_array_equal(riftco.uniform([1000], -2.0, 3.0).numpy(), a.numpy())
    np.testing.assert_array_equal(riftco.normal([4000], 1.0, 2.0).numpy(), n.numpy())
    u = a.numpy()
    assert u.min() >= -2.0 and u.max() <= 3.0 and not a.requires_grad
    assert n.requires_grad and n.is_leaf
    assert abs(float(n.numpy().mean()) - 1.0) < 0.15 and abs(float(n.numpy().std()) - 2.0) < 0.15
    assert riftco.uniform([2, 0]).shape == (2, 0)
    with pytest.raises(riftco.ConfigError, match="low=1, high=1"):
        riftco.uniform([3], 1.0, 1.0)
    with pytest.raises(riftco.ConfigError, match="std=-1"):
        riftco.normal([3], 0.0, -1.0)
    with pytest.raises(riftco.ConfigError, match="inf"):
        riftco.uniform([3], 0.0, float("inf"))
    with pytest.raises(riftco.ShapeError, match="too many elements"):
        riftco.uniform([2**40, 2**40])


def test_a_checkpointed_module_with_dropout_and_an_unread_leaf_matches_the_plain_run() -> None:
    """Discovery finds the unread frozen leaf, which the native checkpoint leaves out of the
    boundary; the replay draws the forward run's dropout masks, so the values and the
    gradients are the plain run's."""

    class Noisy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.drop = nn.Dropout(0.3)
            self.unused = riftco.Variable(np.ones(8))

        def forward(self, x: riftco.Variable) -> riftco.Variable:
            return self.drop(F.relu(self.fc(x)))

    riftco.manual_seed(4)
    m = Noisy()
    x = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    results = []
    for use_checkpoint in (False, True):
        riftco.manual_seed(123)
        xv = riftco.Variable(x, requires_grad=True)
        y = riftco.checkpoint(m, xv) if use_checkpoint else m(xv)
        F.sum(F.mul(y, y)).backward()
        results.append((y.numpy(), xv.grad, m.fc.weight.grad, riftco.get_rng_state()))
    (y0, gx0, gw0, s0), (y1, gx1, gw1, s1) = results
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(gx0, gx1)
    np.testing.assert_array_equal(gw0, gw1)
    assert s0 == s1  # the replay does not advance the caller's stream
    assert (y0 == 0).sum() > 0
