"""Re-exports :mod:`riftco.training.plotting`, this module's home since the package has wings."""

from riftco.training import plotting as _module
from riftco.training.plotting import *  # noqa: F403
from riftco.training.plotting import __all__ as __all__

__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
