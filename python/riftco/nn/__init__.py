"""``riftco.nn``: PyTorch-style modules over riftco Variables.

- ``Module``: the base class (parameters discovered from attributes, ``named_parameters()``
  with dotted names, ``train()``/``eval()``, ``zero_grad()``, ``to(device)``, calling runs
  ``forward``);
- containers ``Sequential`` and ``ModuleList``;
- layers ``Linear``, ``Embedding``, ``RMSNorm``, ``Dropout``, ``ReLU``, ``GELU``, ``SiLU``.

A module is a callable, so ``riftco.checkpoint(block, x)`` checkpoints it; its dependencies are
the leaves it holds (``named_variables()``) that the output depends on.
"""

from riftco.nn.containers import ModuleList, Sequential
from riftco.nn.layers import GELU, Dropout, Embedding, Linear, ReLU, RMSNorm, SiLU
from riftco.nn.module import Module

__all__ = [
    "GELU",
    "Dropout",
    "Embedding",
    "Linear",
    "Module",
    "ModuleList",
    "RMSNorm",
    "ReLU",
    "Sequential",
    "SiLU",
]
