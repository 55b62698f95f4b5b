"""Finding the leaf Variables a checkpointed callable reads (``riftco.checkpoint`` with
``dependencies=None``).

The search starts from the callable (and the non-Variable arguments it is given) and follows:

- a ``riftco.nn.Module``: every attribute (its parameters, frozen Variables, sub-modules,
  containers) — so a module's dependencies are exactly the leaves it holds;
- a plain function: its closure cells, ``__defaults__`` and ``__kwdefaults__``, and the
  globals its code names (``co_names`` of its code object and of the code of functions nested
  in it, looked up in ``__globals__``);
- a bound method: its ``__self__`` (any object: its attributes) and its function;
- ``functools.partial``: its function, ``args`` and ``keywords``;
- any other object with a ``__dict__`` (a callable object, a holder of weights): its
  attributes; lists, tuples, sets and dict values: their items.

Modules (Python modules), classes, strings, numbers and NumPy arrays are not searched. The
walk is cycle-safe (each object visited once), at most ``MAX_DEPTH`` levels deep and stops
after following ``MAX_OBJECTS`` references. Only leaves are kept (a computed node is the caller's error,
reported by the checkpoint), deduplicated by graph identity, in the order first found.

What it can miss: leaves reached only through ``getattr`` with a computed name, through objects
without ``__dict__`` (native objects, ``__slots__``), deeper than ``MAX_DEPTH``, or created from
module state at call time; then the checkpoint raises ``CheckpointError`` naming the leaf and
telling to pass ``dependencies=[...]``. What it can over-find (a global whose name is also an
attribute name the function reads, as ``co_names`` lists both; a leaf held but not used) is
harmless: the checkpoint keeps only the found leaves its output depends on.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable
from typing import Any

import numpy as np

from riftco._native import Variable, _node_id

__all__ = ["MAX_DEPTH", "MAX_OBJECTS", "discover_leaves"]

MAX_DEPTH = 8
"""How many references deep the search follows from the callable."""

MAX_OBJECTS = 100_000
"""How many references the search follows at most, numbers and strings included (then it stops
with what it found: a long list of data named by the callable costs no more than this)."""

_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), np.ndarray, np.generic)


def _code_names(code: types.CodeType) -> Iterable[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def discover_leaves(roots: Iterable[object], exclude: Iterable[Variable] = ()) -> list[Variable]:
    """The distinct leaf Variables reachable from ``roots`` (see the module documentation),
    without those of ``exclude`` (the checkpoint's inputs), in the order first found.

    Args:
        roots: where to start (the callable, its non-Variable arguments).
        exclude: Variables never returned.

    Returns:
        list[Variable]: trainable and frozen leaves.
    """
    excluded = {_node_id(v) for v in exclude}
    found: dict[int, Variable] = {}
    visited: set[int] = set()
    budget = [MAX_OBJECTS]

    def visit(obj: Any, depth: int) -> None:
        if budget[0] <= 0:
            return
        budget[0] -= 1
        if isinstance(obj, Variable):
            key = _node_id(obj)
            if obj.is_leaf and key not in excluded and key not in found:
                found[key] = obj
            return
        if isinstance(obj, _ATOMS) or isinstance(obj, (types.ModuleType, type)):
            return
        if depth > MAX_DEPTH or id(obj) in visited:
            return
        visited.add(id(obj))
        for child in _references(obj):
            visit(child, depth + 1)

    for root in roots:
        visit(root, 0)
    return list(found.values())


def _references(obj: Any) -> Iterable[object]:
    """What ``obj`` refers to that the search follows."""
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if isinstance(obj, types.MethodType):
        return [obj.__self__, obj.__func__]
    if isinstance(obj, types.FunctionType):
        out: list[object] = [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
        out.extend(obj.__defaults__ or ())
        out.extend((obj.__kwdefaults__ or {}).values())
        g = obj.__globals__
        out.extend(g[n] for n in dict.fromkeys(_code_names(obj.__code__)) if n in g)
        return out
    attrs = getattr(obj, "__dict__", None)
    return list(attrs.values()) if isinstance(attrs, dict) else []


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell (a variable not assigned yet)
        return False
    return True
