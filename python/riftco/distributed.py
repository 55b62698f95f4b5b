"""``riftco.distributed`` re-exports :mod:`riftco.training.distributed` (the module's path before
the package had wings), so that code written against it keeps working. Code inside riftco imports
:mod:`riftco.training.distributed`."""

from riftco.training.distributed import *  # noqa: F403
from riftco.training.distributed import __all__ as __all__
