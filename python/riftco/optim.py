"""``riftco.optim``: the optimizers, with PyTorch's names and defaults.

``Adam`` and ``AdamW`` are the native optimizers (``riftco.Adam``, ``riftco.AdamW``): they take
any iterable of Variables, so ``Adam(model.parameters(), lr=1e-3)`` works as in PyTorch. There
is no ``SGD``: riftco updates parameter values only inside its native optimizers.
"""

from riftco._native import Adam, AdamW

__all__ = ["Adam", "AdamW"]
