"""``checkpoint`` and ``checkpoint_sequential``: activation checkpointing with PyTorch's call
forms over the native ``riftco._native.checkpoint``.

``checkpoint(fn, *args)`` runs ``fn(*args)`` keeping only its output, and runs it once more
during ``backward()`` to rebuild what the gradients need. The native checkpoint must know every
pre-existing leaf ``fn`` reads (``dependencies``); here they are found automatically when not
given (``riftco.autograd.discovery``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

import riftco._native as _native
from riftco._native import CheckpointError, ConfigError, Variable
from riftco.autograd.discovery import discover_leaves

__all__ = ["checkpoint", "checkpoint_sequential"]

_MISSING = "which is not a declared dependency"


def _callable_name(fn: object) -> str:
    """What messages call ``fn`` (the native checkpoint's rule): its ``__qualname__`` or
    ``__name__``, ``partial(<name>)`` for a ``functools.partial``, else its type's name."""

    def own(o: object) -> str | None:
        for attr in ("__qualname__", "__name__"):
            value = getattr(o, attr, None)
            if isinstance(value, str):
                return value
        return None

    name = own(fn)
    if name is not None:
        return name
    inner = getattr(fn, "func", None)
    if inner is not None and own(inner) is not None:
        return f"partial({own(inner)})"
    return type(fn).__qualname__


def _split_positional(
    args: tuple[Any, ...], dependencies: Sequence[Variable] | None
) -> tuple[list[Any], Sequence[Variable] | None]:
    """The positional arguments for ``fn`` and the dependencies, reading a trailing list or
    tuple of Variables after at least one Variable input as the dependencies (the older
    ``checkpoint(fn, x, [w])`` form)."""
    items = list(args)
    if len(items) >= 2 and isinstance(items[-1], (list, tuple)):
        last = items[-1]
        legacy = all(isinstance(d, Variable) for d in last)
        if legacy and any(isinstance(a, Variable) for a in items[:-1]):
            if dependencies is not None:
                raise TypeError(
                    "checkpoint: dependencies given twice: as the last positional argument (a "
                    "list of Variables after the inputs) and as dependencies=; pass one (bind a "
                    "list argument of fn with functools.partial)"
                )
            return items[:-1], list(last)
    return items, dependencies


def checkpoint(
    function: Callable[..., Variable],
    *args: Any,
    dependencies: Sequence[Variable] | None = None,
    save: Sequence[str] | None = None,
    preserve_rng_state: bool = True,
    determinism_check: str = "metadata",
    name: str | None = None,
    use_reentrant: bool | None = None,
    **kwargs: Any,
) -> Variable:
    """Activation checkpointing (``torch.utils.checkpoint.checkpoint``): returns
    ``function(*args, **kwargs)``, keeping only that output; ``function`` runs once more during
    ``backward()`` to rebuild its graph. Gradients are those of the plain call, bit for bit.

    Inputs: the positional ``Variable`` arguments are the checkpoint's inputs (their gradients
    flow through it; at least one is needed); other positional and keyword arguments are passed
    to ``function`` unchanged at both runs (as in PyTorch; a Variable must be positional).

    Dependencies (every pre-existing leaf ``function`` reads besides the inputs: parameters,
    frozen weights):

    - ``dependencies=None`` (default): found automatically (``riftco.autograd.discovery``): for a
      ``riftco.nn.Module`` or a bound method of one, every leaf the module holds; for a plain
      callable, the leaves its closure, defaults, bound ``self``, ``functools.partial``
      arguments and named globals reach. A leaf found that ``function`` does not read (its
      output does not depend on it) is left out of the boundary and gets no gradient.
    - ``dependencies=[...]``: exactly those, checked as before (no discovery).
    - The older form ``checkpoint(fn, x, [w1, w2])``: a list or tuple whose items are all
      Variables (an empty one too) in the LAST positional place, after at least one Variable
      input, is read as ``dependencies``. To pass such a list to ``fn`` instead, bind it with
      ``functools.partial``.

    Args:
        function: a callable returning a Variable (a function, a ``Module``, a partial).
        *args: the inputs and other arguments of ``function``.
        dependencies: see above.
        save: names of ``riftco.named`` values to keep from the first run (selective
            checkpointing; ``None``: recompute everything).
        preserve_rng_state: replay the first run's random draws (default ``True``).
        determinism_check: ``"off"``, ``"metadata"`` (default; PyTorch's ``"default"`` is
            accepted as its name for it) or ``"values"``.
        name: what error messages call this checkpoint (default: ``function``'s name).
        use_reentrant: accepted for PyTorch compatibility and ignored: riftco's checkpoint
            behaves as PyTorch's ``use_reentrant=False`` (inputs need not require grad,
            keyword arguments are passed on).
        **kwargs: keyword arguments of ``function`` (not Variables).

    Returns:
        Variable: the output, whose gradient flows to the inputs and dependencies.

    Raises:
        TypeError: no Variable input; a Variable keyword argument; dependencies given both
            positionally and as ``dependencies=``; ``function`` returning a non-Variable.
        CheckpointError: the native checkpoint's rejections (duplicate or non-leaf
            dependencies, an undeclared leaf read, ...); with discovery, a leaf ``function``
            reads that discovery did not find (the message names it and says to pass
            ``dependencies=[...]``).
        Exception: whatever ``function`` raises, unchanged.

    Example:
        >>> import numpy as np, riftco
        >>> from riftco import functional as F
        >>> w = riftco.Variable(np.ones((3, 3)), requires_grad=True)
        >>> x = riftco.Variable(np.ones((2, 3)), requires_grad=True)
        >>> y = riftco.checkpoint(lambda h: F.silu(F.linear(h, w)), x)  # w is found
        >>> F.sum(y).backward()
        >>> w.grad.shape
        (3, 3)
    """
    del use_reentrant
    positional, explicit = _split_positional(args, dependencies)
    for key, value in kwargs.items():
        if isinstance(value, Variable):
            raise TypeError(
                f"checkpoint: keyword argument {key!r} is a Variable; pass Variables "
                "positionally (they are the checkpoint's inputs)"
            )
    slots = [i for i, a in enumerate(positional) if isinstance(a, Variable)]
    if not slots:
        raise TypeError(
            "checkpoint: at least one positional argument must be a riftco.Variable (the "
            f"input); got {[type(a).__name__ for a in positional]}"
        )
    inputs = [positional[i] for i in slots]
    label = name if name is not None else _callable_name(function)
    if len(inputs) == len(positional) and not kwargs:
        target: Callable[..., Variable] = function
    else:

        def target(*vs: Variable) -> Variable:
            full = list(positional)
            for i, v in zip(slots, vs):
                full[i] = v
            return function(*full, **kwargs)

    x: Variable | tuple[Variable, ...] = inputs[0] if len(inputs) == 1 else tuple(inputs)
    options: dict[str, Any] = {
        "save": None if save is None else list(save) if not isinstance(save, str) else save,
        "preserve_rng_state": preserve_rng_state,
        # PyTorch's spelling of its (metadata) level.
        "determinism_check": "metadata" if determinism_check == "default" else determinism_check,
        "name": label,
    }
    if explicit is not None:
        return _native.checkpoint(target, x, list(explicit), **options)
    others = [a for a in positional if not isinstance(a, Variable)] + list(kwargs.values())
    deps = discover_leaves([function, *others], exclude=inputs)
    try:
        # A leaf found but not read (a module's unused parameter) is dropped from the boundary.
        return _native.checkpoint(target, x, deps, prune_unused_dependencies=True, **options)
    except CheckpointError as e:
        if _MISSING in str(e):
            raise CheckpointError(
                f"{e}: dependency discovery did not find it (see riftco.discovery for what it "
                "searches); pass dependencies=[...] explicitly"
            ) from e
        raise


def checkpoint_sequential(
    functions: Iterable[Callable[[Variable], Variable]],
    segments: int | np.integer[Any],
    input: Variable,
    use_reentrant: bool | None = None,
    **kwargs: Any,
) -> Variable:
    """``functions`` applied in order with the chain cut into ``segments`` checkpointed pieces
    (``torch.utils.checkpoint.checkpoint_sequential``): each of the first ``segments - 1``
    pieces of ``len(functions) // segments`` functions is one ``checkpoint`` (only its output
    is kept, its inside is recomputed during backward), and the rest runs WITHOUT
    checkpointing, as in PyTorch. With ``segments = sqrt(n)`` the peak activation memory of a
    chain of ``n`` blocks grows as ``sqrt(n)`` instead of ``n`` (Chen et al. 2016).
    Gradients are those of the plain chain, bit for bit.

    Args:
        functions: a ``riftco.nn.Sequential``, ``ModuleList`` or a list of callables
            ``Variable -> Variable``.
        segments: the number of pieces, an int (or NumPy integer) in ``[1, len(functions)]``
            (more pieces than functions is an error, not clamped).
        input: the chain's input.
        use_reentrant: accepted for PyTorch compatibility and ignored.
        **kwargs: passed to each ``checkpoint`` (``preserve_rng_state``, ``determinism_check``,
            ``save``); dependencies are discovered per piece (the leaves its functions hold).

    Returns:
        Variable: the last function's output.

    Raises:
        ConfigError: ``segments`` not an int in ``[1, len(functions)]``, or no functions.
        TypeError: ``input`` is not a Variable, or ``dependencies``/``name`` in ``kwargs``
            (each piece has its own).
        CheckpointError: as ``checkpoint``.
    """
    del use_reentrant
    funcs = list(functions)
    n = len(funcs)
    if n == 0:
        raise ConfigError("checkpoint_sequential: functions is empty")
    if (
        isinstance(segments, (bool, np.bool_))
        or not isinstance(segments, (int, np.integer))
        or not 1 <= segments <= n
    ):
        raise ConfigError(
            f"checkpoint_sequential: segments must be an int in [1, {n}] (the number of "
            f"functions); got {segments!r}"
        )
    segments = int(segments)  # a NumPy integer is accepted as its value
    if not isinstance(input, Variable):
        raise TypeError(
            f"checkpoint_sequential: input must be a riftco.Variable; got {type(input).__name__}"
        )
    for key in ("dependencies", "name"):
        if key in kwargs:
            raise TypeError(f"checkpoint_sequential: {key}= is per piece and cannot be given")

    def run(piece: list[Callable[[Variable], Variable]], h: Variable) -> Variable:
        for f in piece:
            h = f(h)
        return h

    size = n // segments
    end = 0
    for s in range(segments - 1):
        start, end = s * size, (s + 1) * size
        piece = funcs[start:end]
        input = checkpoint(
            functools.partial(run, piece),
            input,
            name=f"checkpoint_sequential segment {s} (functions {start}..{end - 1})",
            **kwargs,
        )
    return run(funcs[end:], input)
