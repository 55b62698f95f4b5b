"""Re-exports :mod:`riftco.data.instruct_corpus`, this module's home since the package has wings."""

from riftco.data import instruct_corpus as _module
from riftco.data.instruct_corpus import *  # noqa: F403
from riftco.data.instruct_corpus import __all__ as __all__

__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
