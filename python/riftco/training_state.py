"""Re-exports :mod:`riftco.training.state`, this module's home since the package has wings."""

from riftco.training import state as _module
from riftco.training.state import *  # noqa: F403
from riftco.training.state import __all__ as __all__

__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
