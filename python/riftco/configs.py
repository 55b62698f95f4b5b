"""Re-exports :mod:`riftco.training.configs`, this module's home since the package has wings."""

from riftco.training import configs as _module
from riftco.training.configs import *  # noqa: F403
from riftco.training.configs import __all__ as __all__

__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
