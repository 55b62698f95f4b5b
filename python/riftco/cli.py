"""``riftco.cli`` re-exports the helpers of the ``riftco`` commands (the module's path before the
package had wings): the argument helpers of :mod:`riftco.commands.arguments` and
:func:`~riftco.commands.runner.run_cli` of :mod:`riftco.commands.runner`. Code inside riftco
imports those modules."""

from riftco.commands import arguments as _arguments
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
