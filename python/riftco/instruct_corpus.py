"""``riftco.instruct_corpus`` re-exports :mod:`riftco.data.instruct_corpus` (the module's path
before the package had wings), so that code written against it keeps working. Code inside riftco
imports :mod:`riftco.data.instruct_corpus`."""

from riftco.data.instruct_corpus import *  # noqa: F403
from riftco.data.instruct_corpus import __all__ as __all__
