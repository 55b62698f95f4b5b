"""``riftco.discovery`` re-exports :mod:`riftco.autograd.discovery` (the module's path before the
package had wings), so that code written against it keeps working. Code inside riftco imports
:mod:`riftco.autograd.discovery`."""

from riftco.autograd.discovery import *  # noqa: F403
from riftco.autograd.discovery import __all__ as __all__
