"""Re-exports :mod:`riftco.training.distributed`, this module's home since the package has wings."""

from riftco.training import distributed as _module
from riftco.training.distributed import *  # noqa: F403
from riftco.training.distributed import __all__ as __all__

__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
