"""``riftco.stdlib_instructions`` re-exports :mod:`riftco.data.stdlib_instructions` (the module's
path before the package had wings), so that code written against it keeps working. Code inside
riftco imports :mod:`riftco.data.stdlib_instructions`."""

from riftco.data.stdlib_instructions import *  # noqa: F403
from riftco.data.stdlib_instructions import __all__ as __all__
