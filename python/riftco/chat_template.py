"""``riftco.chat_template`` re-exports :mod:`riftco.data.chat_template` (the module's path before
the package had wings), so that code written against it keeps working. Code inside riftco imports
:mod:`riftco.data.chat_template`."""

from riftco.data.chat_template import *  # noqa: F403
from riftco.data.chat_template import __all__ as __all__
