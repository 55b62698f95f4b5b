"""``riftco.stages`` re-exports :mod:`riftco.training.stages` (the module's path before the package
had wings), so that code written against it keeps working. Code inside riftco imports
:mod:`riftco.training.stages`."""

from riftco.training.stages import *  # noqa: F403
from riftco.training.stages import __all__ as __all__
