"""Dependency discovery (``riftco.discovery``) finds every leaf ``named_parameters()`` finds
in a ``riftco.nn.Module``, however deep the nesting and whatever data the module also holds, and
a long list of atoms named by a plain function hides nothing."""

from __future__ import annotations

import numpy as np

import riftco
import riftco.autograd.discovery
import riftco.discovery
from riftco import functional as F
from riftco import nn
from riftco.discovery import discover_leaves


def ids(vs: list[riftco.Variable]) -> list[int]:
    return [riftco._native._node_id(v) for v in vs]


def plain_and_checkpointed_grads(m: nn.Module, x: riftco.Variable) -> None:
    """``checkpoint(m, x)`` works and gives the gradients of the plain forward, bitwise."""
    F.sum(m(x)).backward()
    want = [p.grad.copy() for p in m.parameters()]  # type: ignore[union-attr]
    F.sum(riftco.checkpoint(m, x)).backward()
    for w, p in zip(want, m.parameters(), strict=True):
        np.testing.assert_array_equal(p.grad, w)


def test_a_module_nested_deeper_than_max_depth_is_fully_discovered() -> None:
    inner = nn.Linear(4, 4)
    m: nn.Module = inner
    for _ in range(riftco.discovery.MAX_DEPTH + 5):
        m = nn.Sequential(m)
    assert sorted(ids(discover_leaves([m]))) == sorted(ids(list(m.parameters())))
    x = riftco.Variable(np.ones((2, 4)), requires_grad=True)
    plain_and_checkpointed_grads(m, x)
    # The brief's example: five Sequential wrappers.
    m5: nn.Module = nn.Linear(4, 4)
    for _ in range(5):
        m5 = nn.Sequential(m5)
    plain_and_checkpointed_grads(m5, x)


class WithVocabulary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.vocab = [str(i) for i in range(200_000)]  # more atoms than MAX_OBJECTS
        self.table = {i: [i] for i in range(10)}
        self.lin = nn.Linear(4, 4)
        self.extra = [riftco.Variable(np.ones(4), requires_grad=True)]  # found by the walk

    def forward(self, x: riftco.Variable) -> riftco.Variable:
        return self.lin(x) * self.extra[0]


def test_a_big_attribute_before_the_layers_hides_nothing() -> None:
    m = WithVocabulary()
    found = discover_leaves([m])
    want = [*m.parameters(), m.extra[0]]
    assert sorted(ids(found)) == sorted(ids(want))
    x = riftco.Variable(np.ones((2, 4)), requires_grad=True)
    F.sum(riftco.checkpoint(m, x)).backward()
    assert m.lin.weight.grad is not None and m.extra[0].grad is not None


VOCAB = [str(i) for i in range(200_000)]
G_W = riftco.Variable(np.eye(3), requires_grad=True)


def uses_vocabulary_then_weight(x: riftco.Variable) -> riftco.Variable:
    assert len(VOCAB) == 200_000
    return x @ G_W


def test_a_plain_function_naming_a_200k_strings_global_before_its_weight() -> None:
    assert ids(discover_leaves([uses_vocabulary_then_weight])) == ids([G_W])
    x = riftco.Variable(np.ones((2, 3)), requires_grad=True)
    F.sum(riftco.checkpoint(uses_vocabulary_then_weight, x)).backward()
    np.testing.assert_array_equal(G_W.grad, np.full((3, 3), 2.0, dtype=np.float32))


class WithClassAttribute(nn.Module):
    shared = riftco.Variable(np.ones(2), requires_grad=True)  # a class attribute


def test_class_attributes_are_not_searched_as_documented() -> None:
    assert "class attributes" in (riftco.autograd.discovery.__doc__ or "")
    assert discover_leaves([WithClassAttribute()]) == []
