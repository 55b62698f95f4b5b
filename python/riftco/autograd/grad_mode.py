"""Graph recording on or off: ``no_grad``, ``enable_grad``, ``set_grad_enabled`` and
``is_grad_enabled``, with PyTorch's names and semantics.

The switch is per thread (an op computes on the thread that calls it, with the GIL released):
inside ``no_grad()`` ops compute values only, their results have ``requires_grad == False`` and
record no graph, so nothing is kept for a backward pass. A checkpoint replay during
``backward()`` always records (as in PyTorch).

Each form is a context manager and a decorator (``@riftco.no_grad()`` or ``@riftco.no_grad``:
the decorated function
runs with recording off at every call, whatever the caller's setting, and the caller's setting is
restored afterwards, also when it raises). A decorated generator function runs its body with the
mode set at every resumption (each ``next()``/``send()``, ``throw()`` and ``close()``), and the
caller's setting is in force between them, as PyTorch does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Generator
from types import TracebackType
from typing import TypeVar, cast, overload

from riftco._native import _set_grad_enabled, is_grad_enabled

__all__ = ["enable_grad", "is_grad_enabled", "no_grad", "set_grad_enabled"]

_F = TypeVar("_F", bound=Callable[..., object])


class _GradMode:
    """A context manager and decorator that sets the thread's recording switch to ``_mode`` on
    entry and restores the previous setting on exit (nesting and re-entering one instance are
    fine: the previous settings are kept on a stack)."""

    _mode: bool

    def __init__(self) -> None:
        self._previous: list[bool] = []

    def __enter__(self) -> None:
        self._previous.append(_set_grad_enabled(self._mode))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _set_grad_enabled(self._previous.pop())

    def _clone(self) -> _GradMode:
        return type(self)()

    def __call__(self, fn: _F) -> _F:
        """Decorates ``fn``: every call runs inside a fresh copy of this context (for a generator
        function: every resumption of the generator)."""
        if inspect.isgeneratorfunction(fn):
            return cast(_F, self._wrap_generator(fn))

        @functools.wraps(fn)
        def wrapper(*args: object, **kwargs: object) -> object:
            with self._clone():
                return fn(*args, **kwargs)

        return cast(_F, wrapper)

    def _wrap_generator(
        self, fn: Callable[..., Generator[object, object, object]]
    ) -> Callable[..., Generator[object, object, object]]:
        """A generator function that runs each step of ``fn``'s generator inside a fresh copy
        of this context and yields to its caller outside it."""

        @functools.wraps(fn)
        def generator(*args: object, **kwargs: object) -> Generator[object, object, object]:
            with self._clone():
                gen = fn(*args, **kwargs)
            try:
                with self._clone():
                    response = gen.send(None)
                while True:
                    try:
                        request = yield response
                    except GeneratorExit:
                        with self._clone():
                            gen.close()
                        raise
                    except BaseException as exc:
                        with self._clone():
                            response = gen.throw(exc)
                    else:
                        with self._clone():
                            response = gen.send(request)
            except StopIteration as stop:
                return stop.value

        return generator


class _NoGrad(_GradMode):
    """The context of ``no_grad()``."""

    _mode = False


class _EnableGrad(_GradMode):
    """The context of ``enable_grad()``."""

    _mode = True


def _context_or_decorated(
    factory: type[_GradMode], what: str, orig_func: _F | None
) -> _GradMode | _F:
    if orig_func is None:
        return factory()
    if not callable(orig_func):
        raise TypeError(
            f"{what}() takes no arguments (or a function to decorate); got {orig_func!r}"
        )
    return factory()(orig_func)


@overload
def no_grad() -> _GradMode: ...
@overload
def no_grad(orig_func: _F) -> _F: ...
def no_grad(orig_func: _F | None = None) -> _GradMode | _F:
    """Disables graph recording on this thread inside the ``with`` block or the decorated
    function (``torch.no_grad``): ops return constants (``requires_grad == False``), and
    ``backward()`` of such a result raises. A decorator with or without parentheses
    (``@riftco.no_grad()``, ``@riftco.no_grad``).

    Args:
        orig_func: a function to decorate (the bare-decorator form); omitted for the context.

    Returns:
        A context manager (and decorator), or the decorated function.

    Raises:
        TypeError: ``orig_func`` is not callable.

    Example:
        >>> import numpy as np, riftco
        >>> from riftco import functional as F
        >>> w = riftco.Variable(np.ones((2, 2)), requires_grad=True)
        >>> with riftco.no_grad():
        ...     y = F.linear(riftco.Variable(np.ones((1, 2))), w)
        >>> y.requires_grad
        False
    """
    return _context_or_decorated(_NoGrad, "no_grad", orig_func)


@overload
def enable_grad() -> _GradMode: ...
@overload
def enable_grad(orig_func: _F) -> _F: ...
def enable_grad(orig_func: _F | None = None) -> _GradMode | _F:
    """Enables graph recording inside the ``with`` block or the decorated function, also
    within ``no_grad`` (``torch.enable_grad``); with or without parentheses as a decorator.

    Args:
        orig_func: a function to decorate (the bare-decorator form); omitted for the context.

    Returns:
        A context manager (and decorator), or the decorated function.

    Raises:
        TypeError: ``orig_func`` is not callable.
    """
    return _context_or_decorated(_EnableGrad, "enable_grad", orig_func)


class set_grad_enabled(_GradMode):  # noqa: N801 (PyTorch's name)
    """Sets graph recording on or off (``torch.set_grad_enabled``): called as a function it
    takes effect at once; used as a context manager it also restores the previous setting on
    exit; as a decorator each call of the function runs with ``mode``.

    Args:
        mode: ``True`` to record, ``False`` not to.

    Raises:
        TypeError: ``mode`` is not a bool.
    """

    def __init__(self, mode: bool) -> None:
        if not isinstance(mode, bool):
            raise TypeError(f"set_grad_enabled: mode must be a bool; got {mode!r}")
        super().__init__()
        self._mode = mode
        # Takes effect now (the function form); __enter__ then records the setting it replaced.
        self._before = _set_grad_enabled(mode)

    def __enter__(self) -> None:
        _set_grad_enabled(self._mode)
        self._previous.append(self._before)

    def _clone(self) -> _GradMode:
        return _Fixed(self._mode)

    def __call__(self, fn: _F) -> _F:
        """Decorates ``fn``; the switch made at construction is undone (as in PyTorch, the
        decorator form changes nothing until ``fn`` is called)."""
        _set_grad_enabled(self._before)
        return super().__call__(fn)


class _Fixed(_GradMode):
    """``set_grad_enabled(mode)`` as a decorator's per-call context (it does not switch at
    construction)."""

    def __init__(self, mode: bool) -> None:
        super().__init__()
        self._mode = mode
