"""``riftco.checkpoint`` with PyTorch's call forms: dependencies discovered from the callable
(closure, defaults, bound attributes, globals, partials, modules), the older positional
dependency list, non-Variable arguments, several inputs; and ``checkpoint_sequential``.
Gradients through a checkpoint equal the plain ones bit for bit."""

from __future__ import annotations

import doctest
import functools
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

import riftco
import riftco.autograd.checkpointing
import riftco.discovery
import riftco.autograd.grad_mode
from riftco import functional as F
from riftco import nn
from riftco.discovery import discover_leaves

F32 = npt.NDArray[np.float32]


def leaf(shape: tuple[int, ...], seed: int, name: str | None = None) -> riftco.Variable:
    rng = np.random.default_rng(seed)
    return riftco.Variable(rng.standard_normal(shape) * 0.5, requires_grad=True, name=name)


def grads(*vs: riftco.Variable) -> list[F32 | None]:
    return [v.grad for v in vs]


def assert_bitwise(got: list[F32 | None], want: list[F32 | None]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g is not None and w is not None
        np.testing.assert_array_equal(g, w)


def ids(vs: list[riftco.Variable]) -> list[int]:
    return [riftco._native._node_id(v) for v in vs]


# Module-level leaves for the globals test (found through the function's co_names).
G_W1 = leaf((7, 5), 11, "G_W1")
G_W2 = leaf((5, 7), 12, "G_W2")


def global_block(h: riftco.Variable) -> riftco.Variable:
    return F.linear(F.silu(F.linear(h, G_W1)), G_W2)


def run_both(
    fn: Callable[[riftco.Variable], riftco.Variable],
    x: riftco.Variable,
    params: list[riftco.Variable],
) -> None:
    """Plain, then checkpointed with discovery: bitwise equal gradients of x and params."""
    F.sum(fn(x)).backward()
    want = grads(x, *params)
    F.sum(riftco.checkpoint(fn, x)).backward()
    assert_bitwise(grads(x, *params), want)


# ---------------------------------------------------------------------------------------------
# discovery
# ---------------------------------------------------------------------------------------------


def test_discovery_finds_a_leaf_hidden_in_a_closure() -> None:
    x, w1, w2 = leaf((3, 5), 0), leaf((7, 5), 1), leaf((5, 7), 2)

    def make() -> Callable[[riftco.Variable], riftco.Variable]:
        return lambda h: F.linear(F.silu(F.linear(h, w1)), w2)

    fn = make()
    assert ids(discover_leaves([fn], exclude=[x])) == ids([w1, w2])
    run_both(fn, x, [w1, w2])


def test_discovery_finds_a_leaf_in_a_default_argument_and_a_keyword_default() -> None:
    x, w1, w2 = leaf((3, 5), 0), leaf((7, 5), 1), leaf((5, 7), 2)

    def fn(
        h: riftco.Variable, a: riftco.Variable = w1, *, b: riftco.Variable = w2
    ) -> riftco.Variable:
        return F.linear(F.silu(F.linear(h, a)), b)

    assert ids(discover_leaves([fn], exclude=[x])) == ids([w1, w2])
    run_both(fn, x, [w1, w2])


class Holder:
    """A plain object (not a Module) holding weights, checkpointed through a bound method."""

    def __init__(self, w1: riftco.Variable, w2: riftco.Variable) -> None:
        self.weights = {"first": w1}
        self.second = [w2]

    def block(self, h: riftco.Variable) -> riftco.Variable:
        return F.linear(F.silu(F.linear(h, self.weights["first"])), self.second[0])


def test_discovery_finds_leaves_bound_as_attributes_of_self() -> None:
    x, w1, w2 = leaf((3, 5), 0), leaf((7, 5), 1), leaf((5, 7), 2)
    h = Holder(w1, w2)
    assert ids(discover_leaves([h.block], exclude=[x])) == ids([w1, w2])
    run_both(h.block, x, [w1, w2])


def test_discovery_finds_named_globals_and_partial_arguments() -> None:
    x = leaf((3, 5), 0)
    assert ids(discover_leaves([global_block], exclude=[x])) == ids([G_W1, G_W2])
    run_both(global_block, x, [G_W1, G_W2])

    w1, w2 = leaf((7, 5), 1), leaf((5, 7), 2)

    def two(a: riftco.Variable, b: riftco.Variable, h: riftco.Variable) -> riftco.Variable:
        return F.linear(F.silu(F.linear(h, a)), b)

    p = functools.partial(two, w1, b=w2)
    assert ids(discover_leaves([p], exclude=[x])) == ids([w1, w2])
    x.zero_grad()
    F.sum(two(w1, w2, x)).backward()
    want = grads(x, w1, w2)
    F.sum(riftco.checkpoint(functools.partial(two, w1, w2), x)).backward()
    assert_bitwise(grads(x, w1, w2), want)


def test_discovery_excludes_the_inputs_and_deduplicates_wrappers_of_one_leaf() -> None:
    x, w = leaf((3, 5), 0), leaf((5, 5), 1)
    same_w = [w, riftco._native.Variable(w)]  # a copy is another leaf: listed
    fn = lambda h: F.linear(F.linear(h, w), same_w[0]) if x is not None else h  # noqa: E731
    found = discover_leaves([fn, fn, [w, w]], exclude=[x])
    assert ids(found) == ids([w, same_w[1]])


def test_discovery_is_cycle_safe_and_bounded() -> None:
    w = leaf((2, 2), 1)
    loop: list[object] = [w]
    loop.append(loop)
    assert ids(discover_leaves([loop])) == ids([w])
    deep: list[object] = [w]
    for _ in range(riftco.discovery.MAX_DEPTH + 2):
        deep = [deep]
    assert discover_leaves([deep]) == []
    # The budget counts containers and objects (atoms are free): it stops after that many.
    data = [[i] for i in range(riftco.discovery.MAX_OBJECTS)]
    assert discover_leaves([[data, [w]]]) == []
    assert ids(discover_leaves([[[w], data]])) == ids([w])
    # A long list of atoms (numbers, strings) before the leaf costs one visit.
    numbers = list(range(riftco.discovery.MAX_OBJECTS))
    assert ids(discover_leaves([[numbers, w]])) == ids([w])


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.up = nn.Linear(d, 2 * d, bias=False)
        self.act = nn.SiLU()
        self.down = nn.Linear(2 * d, d, bias=False)
        self.scale = riftco.Variable(np.full((d,), 0.5, dtype=np.float32))  # frozen, read
        self.note = "not a leaf"

    def forward(self, x: riftco.Variable) -> riftco.Variable:
        return F.silu(self.down(self.act(self.up(x))))  # `scale` is held, not read


def test_module_discovery_finds_exactly_its_leaves() -> None:
    block = Block(4)
    found = discover_leaves([block])
    assert sorted(ids(found)) == sorted(ids([v for _, v in block.named_variables()]))
    assert len(found) == 3
    assert ids([p for p in block.parameters()]) == ids([block.up.weight, block.down.weight])
    x = leaf((3, 4), 0)
    # The frozen `scale` is held but unused: found, then left out of the boundary by the
    # native checkpoint (prune_unused_dependencies) without another run.
    calls = 0

    def counted(h: riftco.Variable) -> riftco.Variable:
        nonlocal calls
        calls += 1
        return block(h)

    params = [block.up.weight, block.down.weight]
    F.sum(block(x)).backward()
    want = grads(x, *params)
    F.sum(riftco.checkpoint(counted, x)).backward()
    assert calls == 2  # the forward run and the replay: no probe run
    assert_bitwise(grads(x, *params), want)


def test_a_leaf_discovery_cannot_reach_raises_a_checkpoint_error_saying_what_to_do() -> None:
    class Slotted:
        __slots__ = ("w",)

        def __init__(self, w: riftco.Variable) -> None:
            self.w = w

    x, w = leaf((3, 5), 0), leaf((5, 5), 1, name="hidden")
    box = Slotted(w)
    want = r"hidden.*discovery did not find it.*dependencies=\[\.\.\.\]"
    with pytest.raises(riftco.CheckpointError, match=want):
        riftco.checkpoint(lambda h: F.linear(h, box.w), x)
    # the explicit form keeps the native message
    with pytest.raises(riftco.CheckpointError, match="hidden") as info:
        riftco.checkpoint(lambda h: F.linear(h, box.w), x, dependencies=[])
    assert "discovery did not find" not in str(info.value)
    y = riftco.checkpoint(lambda h: F.linear(h, box.w), x, dependencies=[w])
    F.sum(y).backward()
    assert w.grad is not None


# ---------------------------------------------------------------------------------------------
# call forms
# ---------------------------------------------------------------------------------------------


def test_positional_dependencies_still_work_and_both_forms_at_once_is_a_type_error() -> None:
    x, w1, w2 = leaf((3, 5), 0), leaf((7, 5), 1), leaf((5, 7), 2)
    def fn(h: riftco.Variable) -> riftco.Variable:
        return F.linear(F.silu(F.linear(h, w1)), w2)

    F.sum(fn(x)).backward()
    want = grads(x, w1, w2)
    for deps in ([w1, w2], (w1, w2)):
        F.sum(riftco.checkpoint(fn, x, deps)).backward()
        assert_bitwise(grads(x, w1, w2), want)
        F.sum(riftco.checkpoint(fn, x, dependencies=deps)).backward()
        assert_bitwise(grads(x, w1, w2), want)
    with pytest.raises(riftco.CheckpointError, match="w1|#"):
        riftco.checkpoint(fn, x, [w2])  # positional: exactly these, w1 missing
    with pytest.raises(TypeError, match="dependencies given twice"):
        riftco.checkpoint(fn, x, [w1, w2], dependencies=[w1, w2])


def test_non_variable_arguments_are_passed_through_and_the_name_is_the_functions() -> None:
    x, w = leaf((3, 5), 0), leaf((5, 5), 1)
    seen: list[tuple[float, str]] = []

    def scaled_block(h: riftco.Variable, alpha: float, *, tag: str) -> riftco.Variable:
        seen.append((alpha, tag))
        return F.scale(F.linear(h, w), alpha)

    F.sum(scaled_block(x, 2.0, tag="t")).backward()
    want = grads(x, w)
    F.sum(
        riftco.checkpoint(
            scaled_block, x, 2.0, tag="t", use_reentrant=False, determinism_check="default"
        )
    ).backward()  # PyTorch's spellings are accepted
    assert_bitwise(grads(x, w), want)
    assert seen == [(2.0, "t")] * 3  # plain, first run, replay
    hidden = leaf((5, 5), 2, name="hidden2")
    with pytest.raises(riftco.CheckpointError, match="scaled_or_not"):

        def scaled_or_not(h: riftco.Variable, alpha: float) -> riftco.Variable:
            return F.scale(F.linear(h, hidden), alpha)

        riftco.checkpoint(scaled_or_not, x, 3.0, dependencies=[])


def test_bad_call_forms_raise_type_errors() -> None:
    x, w = leaf((3, 5), 0), leaf((5, 5), 1)
    with pytest.raises(TypeError, match="at least one positional argument must be a riftco"):
        riftco.checkpoint(lambda a: F.linear(x, w), 3.0)
    with pytest.raises(TypeError, match="keyword argument 'h' is a Variable"):
        riftco.checkpoint(lambda *, h: F.linear(h, w), 1, h=x)


def test_several_variable_inputs_each_get_their_gradient() -> None:
    a, b, w = leaf((3, 5), 0), leaf((3, 5), 1), leaf((5, 5), 2)

    def two(p: riftco.Variable, q: riftco.Variable) -> riftco.Variable:
        return F.silu(F.add(F.linear(p, w), F.mul(q, q)))

    F.sum(two(a, b)).backward()
    want = grads(a, b, w)
    F.sum(riftco.checkpoint(two, a, b)).backward()
    assert_bitwise(grads(a, b, w), want)


# ---------------------------------------------------------------------------------------------
# checkpoint_sequential
# ---------------------------------------------------------------------------------------------


def chain(n: int, d: int = 6) -> nn.Sequential:
    riftco.manual_seed(5)
    return nn.Sequential(*[m for _ in range(n) for m in (nn.Linear(d, d, bias=False), nn.SiLU())])


@pytest.mark.parametrize("segments", [1, 2, 3, 5, 10])
def test_checkpoint_sequential_gradients_equal_the_plain_chain_bitwise(segments: int) -> None:
    seq = chain(5)
    x = leaf((4, 6), 0)
    params = list(seq.parameters())
    F.sum(seq(x)).backward()
    want = grads(x, *params)
    out = riftco.checkpoint_sequential(seq, segments, x)
    np.testing.assert_array_equal(out.numpy(), seq(x).numpy())
    F.sum(out).backward()
    assert_bitwise(grads(x, *params), want)
    # a plain list of callables works too
    F.sum(riftco.checkpoint_sequential(list(seq), segments, x)).backward()
    assert_bitwise(grads(x, *params), want)


def test_checkpoint_sequential_replays_each_segment_but_not_the_last() -> None:
    calls: list[int] = []
    seq = chain(4)

    def tracer(i: int) -> Callable[[riftco.Variable], riftco.Variable]:
        m = seq[i]  # each function holds its own module only: discovery is exact

        def f(h: riftco.Variable) -> riftco.Variable:
            calls.append(i)
            return m(h)

        return f

    funcs = [tracer(i) for i in range(len(seq))]
    x = leaf((4, 6), 0)
    out = riftco.checkpoint_sequential(funcs, 4, x)  # pieces of 2 functions; the last plain
    assert calls == list(range(8))
    calls.clear()
    F.sum(out).backward()
    assert sorted(calls) == [0, 1, 2, 3, 4, 5]  # three checkpointed pieces replayed, not 6, 7


def test_checkpoint_sequential_rejects_bad_segments() -> None:
    seq = chain(2)
    x = leaf((4, 6), 0)
    for bad in (0, 5, -1, 2.0, True):
        with pytest.raises(riftco.ConfigError, match=r"segments must be an int in \[1, 4\]"):
            riftco.checkpoint_sequential(seq, bad, x)  # type: ignore[arg-type]
    with pytest.raises(riftco.ConfigError, match="empty"):
        riftco.checkpoint_sequential([], 1, x)
    with pytest.raises(TypeError, match="input must be a riftco.Variable"):
        riftco.checkpoint_sequential(seq, 2, np.ones((4, 6)))  # type: ignore[arg-type]


def test_python_layer_docstring_examples_run() -> None:
    ran = 0
    for module in (riftco.autograd.checkpointing, riftco.autograd.grad_mode):
        result = doctest.testmod(module, extraglobs={"riftco": riftco})
        assert result.failed == 0
        ran += result.attempted
    assert ran >= 4
