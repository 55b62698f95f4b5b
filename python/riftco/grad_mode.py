"""Re-exports :mod:`riftco.autograd.grad_mode`, this module's home since the package has wings."""

from riftco.autograd import grad_mode as _module
from riftco.autograd.grad_mode import *  # noqa: F403
from riftco.autograd.grad_mode import __all__ as __all__

__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
