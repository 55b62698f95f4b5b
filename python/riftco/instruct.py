"""``riftco.instruct`` re-exports :mod:`riftco.data.instruct` (the module's path before the package
had wings), so that code written against it keeps working. Code inside riftco imports
:mod:`riftco.data.instruct`."""

from riftco.data.instruct import *  # noqa: F403
from riftco.data.instruct import __all__ as __all__
