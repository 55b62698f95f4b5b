"""Re-exports :mod:`riftco.data.stdlib_instructions`, this module's home since the package has wings."""

from riftco.data import stdlib_instructions as _module
from riftco.data.stdlib_instructions import *  # noqa: F403
from riftco.data.stdlib_instructions import __all__ as __all__

__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
