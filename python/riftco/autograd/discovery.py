"""Finding the leaf Variables a checkpointed callable reads (``riftco.checkpoint`` with
``dependencies=None``).

The search starts from the callable (and the non-Variable arguments it is given) and follows:

- a ``riftco.nn.Module``: all of its ``named_variables()`` (the leaves held by it and its
  sub-modules, however deep, outside the depth and object limits below), then the other
  instance attributes of it and of its sub-modules (neither a ``Module`` nor a ``Variable``:
  containers, holders of weights) are walked as any object — so a module's dependencies are
  at least the leaves ``named_parameters()`` finds;
- a plain function: its closure cells, ``__defaults__`` and ``__kwdefaults__``, and the
  globals its code names (``co_names`` of its code object and of the code of functions nested
  in it, looked up in ``__globals__``);
- a bound method: its ``__self__`` (any object: its attributes) and its function;
- ``functools.partial``: its function, ``args`` and ``keywords``;
- any other object with a ``__dict__`` (a callable object, a holder of weights): its
  attributes; lists, tuples, sets and dict values: their items.

Modules (Python modules), classes, strings, numbers and NumPy arrays (the atoms) are not
searched. The walk is cycle-safe (each object visited once), follows at most ``MAX_DEPTH``
levels of references below the callable (or below a ``riftco.nn.Module``) and stops after
visiting ``MAX_OBJECTS`` containers and objects; atoms and Variables do not count against
that budget, so a long list of strings or numbers before the weights (a vocabulary) costs one
visit and hides nothing. Only leaves are kept (a computed node is the caller's error, reported
by the checkpoint), deduplicated by graph identity, in the order first found.

What it can miss: leaves reached only through ``getattr`` with a computed name; through objects
without ``__dict__`` (native objects, ``__slots__``); class attributes (only instance
``__dict__`` entries are searched, a ``Variable`` assigned on a class is not found); outside
modules, leaves deeper than ``MAX_DEPTH`` or after ``MAX_OBJECTS`` containers (a structure of
more than that many lists, dicts or objects); or leaves created from module state at call
time; then the checkpoint raises ``CheckpointError`` naming the leaf and telling to pass
``dependencies=[...]``. What it can over-find (a global whose name is also an
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
from riftco.nn.module import Module

__all__ = ["MAX_DEPTH", "MAX_OBJECTS", "discover_leaves"]

MAX_DEPTH = 8
"""How many references deep the search follows from the callable or from a module (the leaves
of a ``riftco.nn.Module`` are all found, however deeply nested)."""

MAX_OBJECTS = 100_000
"""How many containers and objects the search visits at most (atoms — strings, numbers, NumPy
arrays — and Variables are not counted; then it stops with what it found)."""

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

    def keep(v: Variable) -> None:
        key = _node_id(v)
        if v.is_leaf and key not in excluded and key not in found:
            found[key] = v

    def visit(obj: Any, depth: int) -> None:
        if isinstance(obj, Variable):
            keep(obj)
            return
        if isinstance(obj, _ATOMS) or isinstance(obj, (types.ModuleType, type)):
            return
        if isinstance(obj, Module):
            visit_module(obj)
            return
        if budget[0] <= 0 or depth > MAX_DEPTH or id(obj) in visited:
            return
        budget[0] -= 1
        visited.add(id(obj))
        for child in _references(obj):
            visit(child, depth + 1)

    def visit_module(module: Module) -> None:
        if id(module) in visited:
            return
        for _, v in module.named_variables():
            keep(v)
        for m in module.modules():
            if id(m) in visited:
                continue
            visited.add(id(m))
            for value in vars(m).values():
                if not isinstance(value, (Module, Variable)):
                    visit(value, 1)

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
