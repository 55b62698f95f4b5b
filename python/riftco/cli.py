"""Re-exports the helpers of the ``riftco`` commands, :mod:`riftco.commands.arguments` (their
flags and argument types) and :mod:`riftco.commands.runner` (``run_cli``), at their path from
before the package had wings."""

from typing import Any

from riftco.commands import arguments as _arguments
from riftco.commands import runner as _runner
from riftco.commands.arguments import *  # noqa: F403
from riftco.commands.arguments import (
    add_dropout_arguments,
    add_resume_argument,
    loss_chunk_bytes_arg,
    plain_text,
    probability,
)
from riftco.commands.runner import EXIT_INTERRUPTED, run_cli

__all__ = [
    "EXIT_INTERRUPTED",
    "add_dropout_arguments",
    "add_resume_argument",
    "loss_chunk_bytes_arg",
    "plain_text",
    "probability",
    "run_cli",
]
__all__ += _arguments.__all__


def __getattr__(name: str) -> Any:
    """The other names of the two modules, private helpers too (read only)."""
    try:
        return getattr(_arguments, name)
    except AttributeError:
        return getattr(_runner, name)
