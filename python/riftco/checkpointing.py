"""Re-exports :mod:`riftco.autograd.checkpointing`, this module's home since the package has wings."""

from riftco.autograd import checkpointing as _module
from riftco.autograd.checkpointing import *  # noqa: F403
from riftco.autograd.checkpointing import __all__ as __all__

__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
