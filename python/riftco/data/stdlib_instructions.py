"""A small instruction dataset on every machine, built from what every CPython ships: questions
about standard-library functions, classes and methods, answered by the first paragraph of their
docstrings (``inspect.getdoc``). Nothing is downloaded and no file is shipped: the rows are made
from the running interpreter, so they follow its version (as the default corpora do). The text
is the Python documentation's own, under the Python Software Foundation License, like the
interpreter it comes from.

Each row is a conversation, ``{"messages": [{"role": "user", "content": question},
{"role": "assistant", "content": answer}]}``, in a fixed shuffled order (collected module by
module as listed in :data:`MODULES`, names sorted, then shuffled by ``random.Random(0)`` so that
a held-out tail covers every module); objects reachable under several names are asked about
once.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import random
import re
import zlib
from pathlib import Path
from typing import Any

__all__ = ["MODULES", "stdlib_instructions", "write_stdlib_instructions"]

MODULES = (
    "builtins", "str", "list", "dict", "set", "math", "os.path", "itertools", "functools",
    "operator", "textwrap", "json", "re", "collections", "heapq", "bisect", "statistics",
    "shutil", "fnmatch", "base64", "zlib", "difflib", "html", "urllib.parse", "calendar",
    "random", "copy", "inspect", "shlex", "struct", "string",
)
"""Where the questions come from: modules, and the methods of the built-in types named by
their type (``str``, ``list``, ``dict``, ``set``)."""

_QUESTIONS = (
    "What does {name} do?",
    "Explain {name} in one sentence.",
    "In Python, what is {name} for?",
    "Describe {name}.",
)
_BUILTIN_TYPES: dict[str, type] = {"str": str, "list": list, "dict": dict, "set": set}
_SIGNATURE = re.compile(r"^[\w.]+\(.*\)( -> .*)?$", re.S)


def _first_paragraph(doc: str, max_chars: int) -> str | None:
    for paragraph in doc.split("\n\n"):
        text = " ".join(paragraph.split())
        if not text or _SIGNATURE.match(text):
            continue  # a C function's signature line, not prose
        if len(text) > max_chars:
            cut = text.rfind(". ", 0, max_chars)
            if cut < 20:
                return None
            text = text[: cut + 1]
        return text if text[0].isupper() else None
    return None


def _members(module_name: str) -> list[tuple[str, Any]]:
    if module_name in _BUILTIN_TYPES:
        owner: Any = _BUILTIN_TYPES[module_name]
        prefix = f"{module_name}."
    else:
        owner = importlib.import_module(module_name)
        prefix = "" if module_name == "builtins" else f"{module_name}."
    out = []
    for name in sorted(vars(owner)):
        if name.startswith("_"):
            continue
        obj = getattr(owner, name)
        if callable(obj):
            out.append((prefix + name, obj))
    return out


def stdlib_instructions(max_answer_chars: int = 300) -> list[dict[str, Any]]:
    """The rows (see the module docstring): several hundred conversations on CPython 3.11.

    Args:
        max_answer_chars: an answer longer than this is cut at its last full sentence within it
            (a paragraph without one is left out).
    """
    rows: list[dict[str, Any]] = []
    seen: set[int] = set()
    for module_name in MODULES:
        for name, obj in _members(module_name):
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            doc = inspect.getdoc(obj)
            answer = _first_paragraph(doc, max_answer_chars) if doc else None
            if answer is None:
                continue
            shown = f"{name}()" if not inspect.isclass(obj) else name
            question = _QUESTIONS[zlib.crc32(name.encode()) % len(_QUESTIONS)].format(name=shown)
            rows.append(
                {
                    "messages": [
                        {"role": "user", "content": question},
                        {"role": "assistant", "content": answer},
                    ]
                }
            )
    random.Random(0).shuffle(rows)
    return rows


def write_stdlib_instructions(path: str | os.PathLike[str]) -> Path:
    """Writes :func:`stdlib_instructions` as JSON Lines to ``path`` and returns it."""
    out = Path(path)
    out.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in stdlib_instructions()),
        encoding="utf-8",
    )
    return out
