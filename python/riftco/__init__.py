"""riftco: train and study LLaMA-style decoder-only transformers with activation checkpointing.

The compute runs in a Rust core (``riftco._native``, released GIL during every compute call);
this package is its Python front:

- autograd: ``Variable`` (``tensor``), ``functional`` ops, ``checkpoint(fn, x, dependencies,
  save=..., preserve_rng_state=True, determinism_check="metadata")`` and ``named(name, fn,
  *inputs)`` (selective checkpointing); the thread's generator state (``manual_seed``,
  ``get_rng_state``, ``set_rng_state``);
- the model: ``TransformerConfig``, ``DecoderOnlyTransformer``, ``DecodeSession``,
  ``Adam``/``AdamW``; activation-checkpointing policies (``ACTIVATION_CHECKPOINTING_POLICIES``,
  ``ACTIVATION_CHECKPOINTING_FORMS``, ``SELECTIVE_POLICIES``, ``BLOCK_VALUE_NAMES``,
  ``parse_activation_checkpointing``, ``parse_byte_size``);
- memory accounting: ``memory_stats()``, ``reset_peak_memory_stats()``, and the buffer pool's
  ``cached_bytes()`` / ``empty_cache()``;
- training stages: ``PretrainingConfig``, ``PostTrainingConfig``, ``run_pretraining``,
  ``run_post_training``, and ``generate``;
- exceptions rooted at ``RiftcoError`` (input errors also subclass ``ValueError``, state and
  device errors ``RuntimeError``, ``OutOfMemoryError`` the builtin ``MemoryError``).
"""

from riftco._native import (
    BLOCK_VALUE_NAMES,
    SELECTIVE_POLICIES,
    Adam,
    AdamW,
    CheckpointError,
    ConfigError,
    DecodeError,
    DecoderOnlyTransformer,
    DecodeSession,
    DeviceMismatchError,
    DeviceUnavailableError,
    LoraError,
    ModelStateError,
    OutOfMemoryError,
    RiftcoError,
    ShapeError,
    StaleGraphError,
    TokenError,
    TransformerConfig,
    Variable,
    __version__,
    cached_bytes,
    checkpoint,
    empty_cache,
    functional,
    get_rng_state,
    manual_seed,
    matmul,
    memory_stats,
    named,
    num_threads,
    parse_activation_checkpointing,
    parse_byte_size,
    reset_peak_memory_stats,
    set_rng_state,
    tensor,
)
from riftco import configs, data, generation, stages
from riftco.configs import *  # noqa: F403
from riftco.data import *  # noqa: F403
from riftco.generation import *  # noqa: F403
from riftco.stages import *  # noqa: F403
from riftco.stages import load_model

__all__ = [
    "BLOCK_VALUE_NAMES",
    "SELECTIVE_POLICIES",
    "Adam",
    "AdamW",
    "CheckpointError",
    "ConfigError",
    "DecodeError",
    "DecodeSession",
    "DecoderOnlyTransformer",
    "DeviceMismatchError",
    "DeviceUnavailableError",
    "LoraError",
    "ModelStateError",
    "OutOfMemoryError",
    "RiftcoError",
    "ShapeError",
    "StaleGraphError",
    "TokenError",
    "TransformerConfig",
    "Variable",
    "__version__",
    "cached_bytes",
    "checkpoint",
    "empty_cache",
    "functional",
    "get_rng_state",
    "manual_seed",
    "matmul",
    "memory_stats",
    "named",
    "num_threads",
    "parse_activation_checkpointing",
    "parse_byte_size",
    "reset_peak_memory_stats",
    "set_rng_state",
    "tensor",
    "load_model",
]
__all__ += configs.__all__
__all__ += data.__all__
__all__ += generation.__all__
__all__ += stages.__all__
