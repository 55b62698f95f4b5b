"""``riftco.configs`` re-exports :mod:`riftco.training.configs` (the module's path before the
package had wings), so that code written against it keeps working. Code inside riftco imports
:mod:`riftco.training.configs`."""

from riftco.training.configs import *  # noqa: F403
from riftco.training.configs import __all__ as __all__
