"""Re-exports :mod:`riftco.data.chat_template`, this module's home since the package has wings."""

from riftco.data import chat_template as _module
from riftco.data.chat_template import *  # noqa: F403
from riftco.data.chat_template import __all__ as __all__

__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
