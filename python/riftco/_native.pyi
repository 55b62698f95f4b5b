"""Type stubs for the PyO3 extension module ``riftco._native`` (hand-written; checked by
``python -m mypy.stubtest riftco._native``)."""

import numpy as np
import numpy.typing as npt

__all__ = ["__version__", "num_threads", "matmul"]

__version__: str

def num_threads() -> int:
    """Number of worker threads the CPU kernels run on (``RIFTCO_NUM_THREADS`` or the number of
    physical cores; at least 1)."""

def matmul(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``a @ b`` for float32 arrays of shapes ``[m, k]`` and ``[k, n]``; returns ``[m, n]``.

    Raises ``ValueError`` when the inner dimensions differ and ``TypeError`` when an argument is
    not a 2-D float32 array.
    """
