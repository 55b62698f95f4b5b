"""``riftco.plotting`` re-exports :mod:`riftco.training.plotting` (the module's path before the
package had wings), so that code written against it keeps working. Code inside riftco imports
:mod:`riftco.training.plotting`."""

from riftco.training.plotting import *  # noqa: F403
from riftco.training.plotting import __all__ as __all__
