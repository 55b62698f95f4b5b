"""Every public object of riftco._native has a docstring, and the examples in them run."""

from __future__ import annotations

import doctest
import inspect
from types import ModuleType
from typing import Any

import pytest

import riftco
import riftco._native as native
from riftco import functional


def public_objects() -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for module in (native, functional):
        prefix = module.__name__
        for name in getattr(module, "__all__", dir(module)):
            obj = getattr(module, name)
            if name.startswith("_") or isinstance(obj, (str, ModuleType)):
                continue
            out.append((f"{prefix}.{name}", obj))
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                for attr, member in vars(obj).items():
                    if not attr.startswith("_"):
                        out.append((f"{prefix}.{name}.{attr}", member))
    return out


@pytest.mark.parametrize(("name", "obj"), public_objects(), ids=lambda v: v if isinstance(v, str) else "")
def test_public_object_has_docstring(name: str, obj: Any) -> None:
    doc = inspect.getdoc(obj)
    assert doc and len(doc.strip()) > 10, f"{name} has no docstring"


def test_docstring_examples_run() -> None:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    ran = 0
    for name, obj in public_objects():
        doc = inspect.getdoc(obj)
        if not doc or ">>>" not in doc:
            continue
        test = doctest.DocTestParser().get_doctest(doc, {"riftco": riftco}, name, None, 0)
        runner.run(test)
        ran += 1
    result = runner.summarize(verbose=False)
    assert ran >= 5
    assert result.failed == 0, f"{result.failed} docstring examples failed"
