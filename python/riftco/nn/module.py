"""``Module``: the base class of ``riftco.nn`` layers, with PyTorch's parameter discovery and
naming.

A module's parameters are found from its attributes, in assignment order: a ``Variable`` with
``requires_grad`` is a parameter, a ``Module`` attribute is a child (its parameters are named
``child.name``), and containers (``Sequential``, ``ModuleList``) name their children ``0``,
``1``, ... — so ``named_parameters()`` gives PyTorch's dotted names (``layers.0.weight``).
Plain lists or dicts of modules are not children (use ``ModuleList``), as in PyTorch. A leaf
reached twice (shared) is listed once, under its first name. ``to(device)`` moves every leaf
to a device.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from riftco._native import Variable, _move_leaves_, _node_id

__all__ = ["Module"]


class Module:
    """Base class of layers: subclasses assign parameters and sub-modules as attributes in
    ``__init__`` and define ``forward``; calling the module calls ``forward``.

    ``training`` (``True`` after construction) is what ``train()`` and ``eval()`` set, on this
    module and every descendant; layers such as ``Dropout`` read it.
    """

    training: bool = True

    def __init__(self) -> None:
        self.training = True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The computation; subclasses define it.

        Raises:
            NotImplementedError: on a module that does not define it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Variable:
        """``forward(*args, **kwargs)`` (typed as a Variable, what every ``riftco.nn`` layer
        returns)."""
        out: Variable = self.forward(*args, **kwargs)
        return out

    # -- structure ------------------------------------------------------------------------

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """The direct sub-modules with their attribute names, in assignment order."""
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value

    def children(self) -> Iterator[Module]:
        """The direct sub-modules, in assignment order."""
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module (named ``prefix``, ``""`` by default) and every descendant with its dotted
        name, depth first; a module reached twice is listed once."""
        seen: set[int] = set()

        def walk(m: Module, name: str) -> Iterator[tuple[str, Module]]:
            if id(m) in seen:
                return
            seen.add(id(m))
            yield name, m
            for child_name, child in m.named_children():
                yield from walk(child, f"{name}.{child_name}" if name else child_name)

        yield from walk(self, prefix)

    def modules(self) -> Iterator[Module]:
        """This module and every descendant, depth first."""
        for _, m in self.named_modules():
            yield m

    def _named_leaves(self, trainable_only: bool) -> Iterator[tuple[str, Variable]]:
        seen: set[int] = set()
        for module_name, m in self.named_modules():
            for name, value in vars(m).items():
                if not isinstance(value, Variable) or not value.is_leaf:
                    continue
                if trainable_only and not value.requires_grad:
                    continue
                key = _node_id(value)
                if key in seen:
                    continue
                seen.add(key)
                yield (f"{module_name}.{name}" if module_name else name), value

    def named_parameters(self) -> Iterator[tuple[str, Variable]]:
        """``(dotted name, parameter)`` for every trainable leaf Variable (``requires_grad``) of
        this module and its descendants, PyTorch's order and names (``0.weight``,
        ``layers.1.bias``); a shared parameter is listed once."""
        return self._named_leaves(trainable_only=True)

    def parameters(self) -> Iterator[Variable]:
        """The trainable leaves of ``named_parameters()`` (what an optimizer updates:
        ``riftco.optim.Adam(model.parameters())``)."""
        for _, p in self.named_parameters():
            yield p

    def named_variables(self) -> Iterator[tuple[str, Variable]]:
        """Like ``named_parameters()`` but also the frozen leaf Variables the modules hold
        (``requires_grad == False``: constants, frozen weights): every leaf ``forward`` may
        read, which ``riftco.checkpoint`` declares as the dependencies of a module."""
        return self._named_leaves(trainable_only=False)

    # -- modes and gradients ----------------------------------------------------------------

    def train(self, mode: bool = True) -> Module:
        """Sets ``training = mode`` on this module and every descendant; returns ``self``.

        Raises:
            TypeError: ``mode`` is not a bool.
        """
        if not isinstance(mode, bool):
            raise TypeError(f"train: mode must be a bool; got {mode!r}")
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> Module:
        """``train(False)``: evaluation mode (dropout off); returns ``self``."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Clears the committed gradient of every parameter."""
        for p in self.parameters():
            p.zero_grad()

    # -- devices ----------------------------------------------------------------------------

    def to(self, device: str) -> Module:
        """Moves every leaf Variable of this module and its descendants (and their gradients)
        to ``device`` in place, like PyTorch's ``module.to``, and returns ``self``: the leaves
        keep their identity, so references to them and optimizers built before the move see
        the moved values (an ``Adam`` built before keeps its moments on the old device and
        raises ``DeviceMismatchError`` at its next step: build optimizers after the move).
        Graphs recorded before the move are stale.

        Args:
            device: ``"cpu"``, ``"vulkan"``, ``"metal"``, ``"gpu"`` or ``"privateuseone"``
                (case-insensitive).

        Raises:
            ConfigError: an unknown device name. DeviceUnavailableError: the GPU asked for has
                no adapter. OutOfMemoryError: a copy could not be allocated. After any of these
                every leaf is where it was.
        """
        leaves: dict[int, Variable] = {}
        for m in self.modules():
            for value in vars(m).values():
                if isinstance(value, Variable) and value.is_leaf:
                    leaves.setdefault(_node_id(value), value)
        _move_leaves_(list(leaves.values()), device)
        return self

    # -- printing ---------------------------------------------------------------------------

    def extra_repr(self) -> str:
        """The text inside this module's parentheses in ``repr`` (layers override it)."""
        return ""

    def __repr__(self) -> str:
        children = list(self.named_children())
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"{type(self).__name__}("]
        if self.extra_repr():
            lines.append(f"  {self.extra_repr()}")
        for name, child in children:
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        lines.append(")")
        return "\n".join(lines)
