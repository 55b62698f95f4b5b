"""Comparing JSON-like settings: a canonical form and the first entry where two differ (what
the ranks of a data-parallel job and the files of a checkpoint are checked with)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["canonical", "first_difference"]


def canonical(value: Any) -> str:
    """``value`` as JSON with sorted keys (objects JSON cannot hold as their ``str``)."""
    return json.dumps(value, sort_keys=True, default=str)


def first_difference(a: Any, b: Any, path: str = "") -> str:
    """The dotted path of the first entry where two JSON-like values differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                return f"{sub}: {a.get(key, '(absent)')!r} against {b.get(key, '(absent)')!r}"
            if canonical(a[key]) != canonical(b[key]):
                return first_difference(a[key], b[key], sub)
    return f"{path or 'value'}: {a!r} against {b!r}"
