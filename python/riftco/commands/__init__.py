"""The ``riftco`` command (``python -m riftco``, or the ``riftco`` console script).

Subcommands: ``pretrain``, ``post-train``, ``generate``, ``export``, ``plot``, ``info`` (one
module each in this package; ``riftco SUBCOMMAND --help`` lists every flag with its default).
The examples ``examples/pretrain.py`` and ``examples/post_train.py`` run the same code.

Exit codes: 0 done, 2 bad input (one ``error:`` line on stderr), 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import ModuleType
from typing import NoReturn

from riftco._native import __version__
from riftco.commands import export, generate, info, plot, post_train, pretrain
from riftco.commands.arguments import ArgumentParser
from riftco.commands.runner import run_cli

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

SUBCOMMANDS: dict[str, ModuleType] = {
    "pretrain": pretrain,
    "post-train": post_train,
    "generate": generate,
    "export": export,
    "plot": plot,
    "info": info,
}


def _summary(module: ModuleType) -> str:
    doc = (module.__doc__ or "").strip().splitlines()
    first = doc[0] if doc else ""
    return first.split(": ", 1)[-1]


def build_parser(prog: str = "riftco") -> ArgumentParser:
    """The parser of the ``riftco`` command with its subcommands."""
    p = ArgumentParser(prog=prog, description=__doc__)
    p.add_argument("--version", action="version", version=f"riftco {__version__}")
    sub = p.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    for name, module in SUBCOMMANDS.items():
        sp = sub.add_parser(
            name,
            help=_summary(module),
            description=module.__doc__,
            epilog=getattr(module, "EPILOG", None),
        )
        module.add_arguments(sp)
        sp.set_defaults(_command=module.run)
    return p


def main(argv: list[str] | None = None, prog: str = "riftco") -> NoReturn:
    """Parses ``argv`` (``sys.argv[1:]`` when ``None``) and runs the subcommand under
    :func:`riftco.commands.runner.run_cli` (exit codes 0, 2, 130)."""
    args = build_parser(prog).parse_args(argv)
    name = f"{prog} {args.command}"
    command: Callable[[argparse.Namespace, str], None] = args._command
    run_cli(lambda: command(args, name), name)
