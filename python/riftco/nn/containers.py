"""``Sequential`` and ``ModuleList``: modules holding an ordered list of sub-modules, named
``0``, ``1``, ... in parameter names (PyTorch's containers)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, overload

from riftco.nn.module import Module

__all__ = ["ModuleList", "Sequential"]


def _checked(items: Iterable[Module], what: str) -> list[Module]:
    out = list(items)
    for i, m in enumerate(out):
        if not isinstance(m, Module):
            raise TypeError(f"{what}: item {i} must be a riftco.nn.Module; got {type(m).__name__}")
    return out


class ModuleList(Module):
    """A list of sub-modules (``torch.nn.ModuleList``): indexable, iterable, ``append`` and
    ``extend``; its modules' parameters are named ``0.weight``, ``1.weight``, ...

    Raises:
        TypeError: an item that is not a ``Module``.
    """

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        self._items: list[Module] = _checked(modules, "ModuleList")

    def named_children(self) -> Iterator[tuple[str, Module]]:
        for i, m in enumerate(self._items):
            yield str(i), m

    def append(self, module: Module) -> ModuleList:
        """Adds ``module`` at the end; returns ``self``."""
        self._items.extend(_checked([module], "ModuleList.append"))
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        """Adds ``modules`` at the end; returns ``self``."""
        self._items.extend(_checked(modules, "ModuleList.extend"))
        return self

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._items)

    @overload
    def __getitem__(self, index: int) -> Module: ...
    @overload
    def __getitem__(self, index: slice) -> ModuleList: ...
    def __getitem__(self, index: int | slice) -> Module | ModuleList:
        if isinstance(index, slice):
            return type(self)(self._items[index])
        return self._items[index]


class Sequential(ModuleList):
    """Modules applied in order (``torch.nn.Sequential``): ``forward(x)`` is
    ``m[-1](...m[1](m[0](x)))``; indexable and iterable like ``ModuleList``.

    Raises:
        TypeError: an argument that is not a ``Module``.
    """

    def __init__(self, *modules: Module) -> None:
        super().__init__(modules)

    def forward(self, x: Any) -> Any:
        """``x`` through every module in order (``x`` itself when empty)."""
        for m in self._items:
            x = m(x)
        return x

    @overload
    def __getitem__(self, index: int) -> Module: ...
    @overload
    def __getitem__(self, index: slice) -> Sequential: ...
    def __getitem__(self, index: int | slice) -> Module | Sequential:
        if isinstance(index, slice):
            return Sequential(*self._items[index])
        return self._items[index]
