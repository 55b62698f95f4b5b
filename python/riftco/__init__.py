"""riftco: train and study LLaMA-style decoder-only transformers with activation checkpointing.

The compute runs in a Rust core (``riftco._native``); this package is its Python front.
"""

from riftco._native import __version__, matmul, num_threads

__all__ = ["__version__", "matmul", "num_threads"]
