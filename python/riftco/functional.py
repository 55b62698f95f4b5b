"""Differentiable ops on riftco Variables: ``import riftco.functional as F``.

Every op of the native ``riftco._native.functional`` is re-exported here (a new native op
appears automatically); each releases the GIL while computing, and shape problems raise
``riftco.ShapeError`` naming both shapes. See each function's docstring for its shapes.
"""

from riftco._native import functional as _native_functional
from riftco._native.functional import *  # noqa: F403

__all__ = [name for name in dir(_native_functional) if not name.startswith("_")]
