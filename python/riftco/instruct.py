"""Re-exports :mod:`riftco.data.instruct`, this module's home since the package has wings."""

from riftco.data import instruct as _module
from riftco.data.instruct import *  # noqa: F403
from riftco.data.instruct import __all__ as __all__

__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
