"""Re-exports :mod:`riftco.autograd.discovery`, this module's home since the package has wings."""

from riftco.autograd import discovery as _module
from riftco.autograd.discovery import *  # noqa: F403
from riftco.autograd.discovery import __all__ as __all__

__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
