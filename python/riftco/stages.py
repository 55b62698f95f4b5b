"""Re-exports :mod:`riftco.training.stages`, this module's home since the package has wings."""

from riftco.training import stages as _module
from riftco.training.stages import *  # noqa: F403
from riftco.training.stages import __all__ as __all__

__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
