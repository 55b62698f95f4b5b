"""``riftco.grad_mode`` re-exports :mod:`riftco.autograd.grad_mode` (the module's path before the
package had wings), so that code written against it keeps working. Code inside riftco imports
:mod:`riftco.autograd.grad_mode`."""

from riftco.autograd.grad_mode import *  # noqa: F403
from riftco.autograd.grad_mode import __all__ as __all__
