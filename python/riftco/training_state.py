"""``riftco.training_state`` re-exports :mod:`riftco.training.state` (the module's path before the
package had wings), so that code written against it keeps working. Code inside riftco imports
:mod:`riftco.training.state`."""

from riftco.training.state import *  # noqa: F403
from riftco.training.state import __all__ as __all__
