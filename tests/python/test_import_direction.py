"""The Python package's wings import in one direction (docs/architecture.md):

    commands  ->  training  ->  data | the PyTorch-style layer  ->  riftco._native

Every module's imports are read with ``ast`` (imports inside functions and ``TYPE_CHECKING``
blocks included). A module may import its own wing and the wings below it; ``data`` and the
PyTorch-style layer sit side by side and do not import each other. No module of a wing imports
the package root (``import riftco``, ``from riftco import <a name of __init__>``) or a re-export
module kept for an old path (``riftco.stages``, ...): it imports the wing module that owns the
name. The package root and the re-export modules are the public surface above every wing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "riftco"

# Wing -> level; a module imports its own wing and wings of a lower level only.
LEVELS = {"native": 0, "autograd": 1, "data": 1, "training": 2, "commands": 3}

# Top-level modules and packages outside riftco/autograd/, data/, training/ and commands/, by
# wing: the PyTorch-style layer's nn/, optim and functional; generation (sampling and decoding
# on the model), which the data wing's tokenizer helpers and the commands share, ranks with data.
TOP_LEVEL_WINGS = {
    "_native": "native",
    "nn": "autograd",
    "optim": "autograd",
    "functional": "autograd",
    "generation": "data",
    "__main__": "commands",
}

# The module paths from before the package had wings, kept as re-exports of their new homes.
RE_EXPORTS = {
    "chat_template": "riftco.data.chat_template",
    "checkpointing": "riftco.autograd.checkpointing",
    "cli": "riftco.commands.arguments",
    "configs": "riftco.training.configs",
    "discovery": "riftco.autograd.discovery",
    "distributed": "riftco.training.distributed",
    "grad_mode": "riftco.autograd.grad_mode",
    "hf_tokenizer": "riftco.data.hf_tokenizer",
    "instruct": "riftco.data.instruct",
    "instruct_corpus": "riftco.data.instruct_corpus",
    "plotting": "riftco.training.plotting",
    "stages": "riftco.training.stages",
    "stdlib_instructions": "riftco.data.stdlib_instructions",
    "training_state": "riftco.training.state",
}

# Modules allowed to import the package root, with the reason. commands/generate.py reads
# riftco.load_model, riftco.generate, ... through it; it is being changed elsewhere, and its
# imports move to the wings once that lands.
ROOT_IMPORT_ALLOWED = {"riftco.commands.generate"}


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def wing_of(module: str) -> str | None:
    """The wing of ``riftco.X...``; ``None`` for the package root and the re-export modules."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    top = parts[1]
    if top in LEVELS:
        return top
    if top in TOP_LEVEL_WINGS:
        return TOP_LEVEL_WINGS[top]
    return None


def is_module(package: Path, dotted: str) -> bool:
    """Whether ``riftco.a.b`` names a module or package of ``package`` (``riftco``)."""
    parts = dotted.split(".")[1:]
    base = package.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file() or (
        base.with_suffix(".pyi").is_file() or (base / "__init__.pyi").is_file()
    )


def imported_modules(
    tree: ast.AST, module: str, is_package: bool, package: Path
) -> list[tuple[int, str]]:
    """``(line, module)`` for every riftco module the source imports; ``"riftco"`` stands for
    a name taken from the package root."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
            found += [(node.lineno, n) for n in names if n.split(".")[0] == "riftco"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "riftco":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if alias.name != "*" and is_module(package, sub):
                    found.append((node.lineno, sub))
                else:
                    found.append((node.lineno, source))
    return found


def violations(package: Path) -> list[str]:
    """Every import against the direction, every module outside a wing that is not a declared
    re-export, and every re-export module that does more than re-export."""
    problems: list[str] = []
    for path in sorted(package.rglob("*.py")):
        module = module_name(path, package)
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
        wing = wing_of(module)
        top = module.split(".")[1] if "." in module else None
        if wing is None:
            if top is not None and top not in RE_EXPORTS:
                problems.append(
                    f"{module}: outside every wing; move it into one (riftco/autograd, data, "
                    "training, commands) or declare it in the test's wing table"
                )
            elif top is not None:
                thin = (ast.Import, ast.ImportFrom, ast.Expr, ast.Assign, ast.AugAssign)
                extra = [
                    type(n).__name__
                    for n in tree.body
                    if not isinstance(n, thin)
                    # the forwarder of the owning module's other names
                    and not (isinstance(n, ast.FunctionDef) and n.name == "__getattr__")
                ]
                if extra:
                    problems.append(f"{module}: a re-export module holds code ({', '.join(extra)})")
            continue
        for line, target in imported_modules(tree, module, path.name == "__init__.py", package):
            where = f"{module} (line {line})"
            if target == "riftco":
                if module not in ROOT_IMPORT_ALLOWED:
                    problems.append(
                        f"{where} imports the package root riftco; import the wing module "
                        "that owns the name"
                    )
                continue
            target_top = target.split(".")[1]
            if target_top in RE_EXPORTS and wing_of(target) is None:
                problems.append(
                    f"{where} imports the re-export {target}; import {RE_EXPORTS[target_top]}"
                )
                continue
            target_wing = wing_of(target)
            if target_wing is None:
                problems.append(f"{where} imports {target}, which is in no wing")
            elif target_wing != wing and LEVELS[target_wing] >= LEVELS[wing]:
                problems.append(
                    f"{where} in the {wing} wing imports {target} of the {target_wing} wing, "
                    "against the direction commands -> training -> data | autograd -> native"
                )
    return problems


def test_the_package_imports_in_one_direction() -> None:
    assert PACKAGE.is_dir(), PACKAGE
    assert violations(PACKAGE) == []


def test_every_re_export_names_an_existing_module() -> None:
    for old, new in RE_EXPORTS.items():
        assert (PACKAGE / f"{old}.py").is_file(), old
        assert is_module(PACKAGE, new), new
        assert f"from {new} import" in (PACKAGE / f"{old}.py").read_text(encoding="utf-8")


def _write(root: Path, files: dict[str, str]) -> Path:
    package = root / "riftco"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for folder in [package, *[p for p in package.rglob("*") if p.is_dir()]]:
        (folder / "__init__.py").touch()
    return package


GOOD = {
    "_native.pyi": "x: int\n",
    "data/text.py": "from riftco._native import x\n",
    "autograd/grad_mode.py": "from riftco._native import x\n",
    "training/loop.py": "from riftco.data.text import x\nfrom riftco.autograd import grad_mode\n",
    "commands/run.py": "from riftco.training.loop import x\nfrom . import run\n",
    "stages.py": (
        '"""A re-export."""\nfrom riftco.training.loop import *\n'
        "def __getattr__(name):\n    return name\n"
    ),
}


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        # data importing training: upwards.
        ("data/bad.py", "from riftco.training.loop import x\n", "against the direction"),
        # the same inside a function, and as a relative import.
        ("data/bad.py", "def f():\n    from ..training import loop\n", "against the direction"),
        # data and the PyTorch-style layer sit side by side.
        ("data/bad.py", "import riftco.autograd.grad_mode\n", "against the direction"),
        # training importing a command.
        ("training/bad.py", "from riftco.commands import run\n", "against the direction"),
        # the package root and a re-export instead of the owning module.
        ("training/bad.py", "import riftco\n", "imports the package root"),
        ("training/bad.py", "from riftco import stages\n", "imports the re-export riftco.stages"),
        ("commands/bad.py", "from riftco.stages import x\n", "imports the re-export"),
        # a new top-level module that belongs to no wing.
        ("loose.py", "x = 1\n", "outside every wing"),
        # a re-export that grew code of its own.
        ("stages.py", "from riftco.training.loop import *\ndef f():\n    pass\n", "holds code"),
    ],
)
def test_an_import_against_the_direction_is_reported(
    tmp_path: Path, name: str, text: str, expected: str
) -> None:
    assert violations(_write(tmp_path / "good", GOOD)) == []
    package = _write(tmp_path / "bad", {**GOOD, name: text})
    found = violations(package)
    assert len(found) == 1 and expected in found[0], found
