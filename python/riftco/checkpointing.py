"""``riftco.checkpointing`` re-exports :mod:`riftco.autograd.checkpointing` (the module's path
before the package had wings), so that code written against it keeps working. Code inside riftco
imports :mod:`riftco.autograd.checkpointing`."""

from riftco.autograd.checkpointing import *  # noqa: F403
from riftco.autograd.checkpointing import __all__ as __all__
