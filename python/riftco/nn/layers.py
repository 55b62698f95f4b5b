"""The layers of ``riftco.nn``: ``Linear``, ``Embedding``, ``RMSNorm``, ``Dropout`` and the
activations ``ReLU``, ``GELU``, ``SiLU``, with PyTorch's names, shapes and initialisations.

Initial values are drawn from this thread's generator (``riftco.manual_seed(s)`` makes them
reproducible; each parameter draws one generator block); parameters are trainable leaves
(``requires_grad=True``), counted as parameter memory in ``riftco.memory_stats()``.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from riftco import functional as F
from riftco._native import ConfigError, Variable, normal, uniform
from riftco.nn.module import Module

__all__ = ["GELU", "Dropout", "Embedding", "Linear", "RMSNorm", "ReLU", "SiLU"]


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) <= 0:
        raise ConfigError(f"{what} must be a positive int; got {value!r}")
    return int(value)


class Linear(Module):
    """``y = x @ weight.T + bias`` (``torch.nn.Linear``).

    ``weight [out_features, in_features]`` and ``bias [out_features]`` start uniform in
    ``[-1/sqrt(in_features), 1/sqrt(in_features)]``, PyTorch's default initialisation.

    Args:
        in_features: the size of the input's last axis (int > 0).
        out_features: the size of the output's last axis (int > 0).
        bias: whether to add a learnable bias.

    Raises:
        ConfigError: a size that is not a positive int.

    Shapes: ``x [..., in_features]`` -> ``[..., out_features]``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = _positive_int(in_features, "Linear: in_features")
        self.out_features = _positive_int(out_features, "Linear: out_features")
        bound = 1.0 / math.sqrt(self.in_features)
        self.weight = uniform(
            [self.out_features, self.in_features], -bound, bound, requires_grad=True
        )
        self.bias: Variable | None = (
            uniform([self.out_features], -bound, bound, requires_grad=True) if bias else None
        )

    def forward(self, x: Variable) -> Variable:
        """``x [..., in_features]`` -> ``[..., out_features]``; ``ShapeError`` for another last
        axis."""
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )


class Embedding(Module):
    """A lookup table of ``num_embeddings`` vectors of size ``embedding_dim``
    (``torch.nn.Embedding``); ``weight`` starts standard normal, as in PyTorch.

    Args:
        num_embeddings: the table's rows (int > 0).
        embedding_dim: the vector size (int > 0).

    Raises:
        ConfigError: a size that is not a positive int.

    Shapes: integer ids of any shape ``S`` -> ``S + (embedding_dim,)``.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = _positive_int(num_embeddings, "Embedding: num_embeddings")
        self.embedding_dim = _positive_int(embedding_dim, "Embedding: embedding_dim")
        self.weight = normal([self.num_embeddings, self.embedding_dim], requires_grad=True)

    def forward(self, ids: npt.ArrayLike) -> Variable:
        """The rows of ``ids`` (an integer array-like); ``TokenError`` for an id outside
        ``[0, num_embeddings)`` or a non-integer dtype."""
        return F.embedding(self.weight, ids)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class RMSNorm(Module):
    """Root-mean-square normalisation over the last axis with a learnable scale ``weight
    [dim]`` starting at ones: ``x / sqrt(mean(x**2, -1) + eps) * weight``
    (``torch.nn.RMSNorm(dim, eps)``).

    Args:
        dim: the size of the normalised last axis (int > 0).
        eps: added to the mean square: a Python or NumPy number, finite and > 0 also once
            rounded to float32 (the smallest accepted is about ``1.4e-45``; default ``1e-6``).

    Raises:
        ConfigError: a non-positive ``dim``; ``eps`` not a finite number > 0, or one that
            rounds to 0 in float32 (``1e-50``), naming it.

    Shapes: ``x [..., dim]`` -> same.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim = _positive_int(dim, "RMSNorm: dim")
        number = isinstance(eps, (int, float, np.integer, np.floating)) and not isinstance(
            eps, (bool, np.bool_)
        )
        if not (number and math.isfinite(float(eps)) and float(eps) > 0):
            raise ConfigError(f"RMSNorm: eps must be a finite number > 0; got {eps!r}")
        with np.errstate(over="ignore"):
            as_f32 = float(np.float32(eps))
        if not (as_f32 > 0 and math.isfinite(as_f32)):
            raise ConfigError(
                f"RMSNorm: eps = {eps!r} is 0 or infinite once rounded to float32 (the values "
                f"are float32): give an eps in [1.4e-45, 3.4e38]"
            )
        self.eps = float(eps)
        self.weight = Variable(np.ones(self.dim, dtype=np.float32), requires_grad=True)

    def forward(self, x: Variable) -> Variable:
        """``x [..., dim]`` normalised; ``ShapeError`` for another last axis."""
        return F.rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"({self.dim},), eps={self.eps}"


class Dropout(Module):
    """Zeroes each element with probability ``p`` while ``training``, scaling the kept ones by
    ``1/(1-p)`` (``torch.nn.Dropout``); the identity after ``eval()``. Masks are drawn from this
    thread's generator, so a checkpoint replay redraws the same mask.

    Args:
        p: the drop probability in ``[0, 1)`` (default 0.5).

    Raises:
        ConfigError: ``p`` outside ``[0, 1)`` (naming it).

    Shapes: any -> same.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ConfigError(f"Dropout: p must be a number in [0, 1); got {p!r}")
        self.p = float(p)

    def forward(self, x: Variable) -> Variable:
        """``x`` with dropout while ``training``, ``x`` itself otherwise."""
        return F.dropout(x, self.p, training=self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class ReLU(Module):
    """``max(x, 0)`` elementwise (``torch.nn.ReLU``). Shapes: any -> same."""

    def forward(self, x: Variable) -> Variable:
        """``relu(x)``."""
        return F.relu(x)


class GELU(Module):
    """The Gaussian error linear unit elementwise (``torch.nn.GELU``). Shapes: any -> same.

    Args:
        approximate: ``"none"`` (exact, with erf; the default) or ``"tanh"`` (the tanh
            approximation), as ``functional.gelu``.

    Raises:
        ConfigError: another ``approximate`` (naming it).
    """

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ConfigError(
                f'GELU: approximate must be "none" or "tanh"; got {approximate!r}'
            )
        self.approximate = approximate

    def forward(self, x: Variable) -> Variable:
        """``gelu(x, approximate)``."""
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return "" if self.approximate == "none" else f"approximate={self.approximate!r}"


class SiLU(Module):
    """``x * sigmoid(x)`` elementwise (``torch.nn.SiLU``). Shapes: any -> same."""

    def forward(self, x: Variable) -> Variable:
        """``silu(x)``."""
        return F.silu(x)
