"""riftco: train and study LLaMA-style decoder-only transformers with activation checkpointing.

The compute runs in a Rust core (``riftco._native``, released GIL during every compute call);
this package is its Python front:

- autograd: ``Variable`` (``tensor``), ``functional`` ops (``import riftco.functional as F``),
  ``checkpoint(fn, *inputs, dependencies=None, save=..., preserve_rng_state=True,
  determinism_check="metadata")`` (dependencies found automatically when not given),
  ``checkpoint_sequential`` and ``named(name, fn, *inputs)`` (selective checkpointing);
  ``no_grad``, ``enable_grad``, ``set_grad_enabled``, ``is_grad_enabled``; the thread's
  generator state (``manual_seed``, ``get_rng_state``, ``set_rng_state``) and draws from it
  (``uniform``, ``normal``);
- PyTorch-style modules and optimizers: ``riftco.nn`` (``Module``, ``Linear``, ``Sequential``,
  ...) and ``riftco.optim`` (``Adam``, ``AdamW``);
- the model: ``TransformerConfig``, ``DecoderOnlyTransformer``, ``DecodeSession``,
  ``Adam``/``AdamW``; activation-checkpointing policies (``ACTIVATION_CHECKPOINTING_POLICIES``,
  ``ACTIVATION_CHECKPOINTING_FORMS``, ``SELECTIVE_POLICIES``, ``BLOCK_VALUE_NAMES``,
  ``parse_activation_checkpointing``, ``parse_byte_size``);
- devices: ``DEVICES`` (``"cpu"``, ``"vulkan"``, ``"metal"``, ``"gpu"``) and ``devices()``
  (each one probed: available or why not, the GPU adapter); ``model.to(device)`` and
  ``Variable.to(device)`` move values there; ``synchronize()`` waits for a GPU's queued work;
- memory accounting: ``memory_stats()``, ``peak_memory_breakdown()`` (what the total peak was
  made of), ``reset_peak_memory_stats()``, and the buffer pool's ``cached_bytes()`` /
  ``empty_cache()``; the kernels' ``num_threads()`` and ``simd_level()``;
- training stages: ``PretrainingConfig``, ``PostTrainingConfig``, ``run_pretraining``,
  ``run_post_training``, and ``generate``; ``training.plotting.write_plots`` (``loss.png``,
  ``memory.png`` of a run, with the optional matplotlib); the ``riftco`` command
  (``python -m riftco``, :mod:`riftco.commands`);
- tokenizers: ``load_tokenizer(path)`` gives the ``Tokenizer`` of a Hugging Face folder
  (``tokenizer.json``), a GGUF file (:mod:`riftco.data.gguf_tokenizer`) or a riftco byte-level
  model (:mod:`riftco.data.tokenizer`), with ``StreamingDetokenizer`` for printing tokens as
  they come; ``generate(model, "text", n, tokenizer=...)`` and ``generate_tokens`` use it;
- instruction/chat data: :mod:`riftco.data.instruct` (``load_rows``, ``build_examples``: JSON
  Lines rows tokenized with the loss on the answers) and :mod:`riftco.data.chat_template` (a
  model folder's Jinja2 chat template, rendered as transformers does);
- GGUF files (llama.cpp): ``load_model("file.gguf")`` loads a ``llama`` one;
  ``read_gguf_metadata``, ``gguf_tensor_infos`` and ``read_gguf_tensor`` (dequantized to
  float32) read any;
- block quantization of a tensor: ``quantize(values, "nf4" | "q4_0" | ...)`` returns the bytes of
  the format's reference quantizer (gguf, llama.cpp, bitsandbytes), ``dequantize(data, dtype,
  shape)`` reads them back to float32;
- exceptions rooted at ``RiftcoError`` (input errors also subclass ``ValueError``, state and
  device errors ``RuntimeError``, ``OutOfMemoryError`` the builtin ``MemoryError``).
"""

from riftco._native import (
    BLOCK_VALUE_NAMES,
    DEVICES,
    IGNORE_INDEX,
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
    IndexOutOfRangeError,
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
    devices,
    empty_cache,
    get_rng_state,
    gguf_tensor_infos,
    manual_seed,
    matmul,
    memory_stats,
    named,
    normal,
    num_threads,
    parse_activation_checkpointing,
    parse_byte_size,
    peak_memory_breakdown,
    dequantize,
    quantize,
    read_gguf_metadata,
    read_gguf_tensor,
    reset_peak_memory_stats,
    set_rng_state,
    simd_level,
    synchronize,
    tensor,
    uniform,
)


def _check_simd_env() -> None:
    """Refuses a ``RIFTCO_SIMD`` level this CPU lacks (or an unknown name) at import, rather than
    letting the kernels run at another level: ``ConfigError`` for a program, and for the
    ``riftco`` command (the console script or ``python -m riftco``) its one error line and exit
    code 2, as for any bad input."""
    import os as _os
    import sys as _sys

    from riftco._native import ConfigError as _ConfigError

    try:
        simd_level()
    except _ConfigError as e:
        argv = list(getattr(_sys, "orig_argv", _sys.argv))
        command = _os.path.basename(_sys.argv[0]) == "riftco" or argv[1:3] == ["-m", "riftco"]
        if not command:
            raise
        print(f"riftco: error: {e}", file=_sys.stderr)
        raise SystemExit(2) from None


_check_simd_env()

from riftco import autograd, data, functional, generation, training  # noqa: E402
from riftco.autograd.checkpointing import checkpoint, checkpoint_sequential
from riftco.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from riftco.data.examples import ExampleBatchSampler, ExampleCorpus, examples_from_pairs
from riftco.data.instruct_corpus import load_example_corpus
from riftco import nn, optim  # noqa: E402 (they import the names above)
from riftco.training.configs import *  # noqa: F403
from riftco.data.text import *  # noqa: F403
from riftco.generation import *  # noqa: F403
from riftco.training.stages import *  # noqa: F403
from riftco.training.stages import load_model
from riftco.data.tokenizer import StreamingDetokenizer, Tokenizer
from riftco.training.tokenizers import load_tokenizer

# The module paths from before the package had wings, kept as re-exports of their new homes
# (docs/architecture.md lists them): ``riftco.stages.run_pretraining`` and the like keep working.
from riftco import (  # noqa: E402
    chat_template,
    checkpointing,
    configs,
    discovery,
    distributed,
    grad_mode,
    instruct,
    instruct_corpus,
    plotting,
    stages,
    training_state,
)

__all__ = [
    "BLOCK_VALUE_NAMES",
    "DEVICES",
    "IGNORE_INDEX",
    "ExampleBatchSampler",
    "ExampleCorpus",
    "examples_from_pairs",
    "load_example_corpus",
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
    "IndexOutOfRangeError",
    "LoraError",
    "ModelStateError",
    "OutOfMemoryError",
    "RiftcoError",
    "ShapeError",
    "StaleGraphError",
    "StreamingDetokenizer",
    "TokenError",
    "Tokenizer",
    "TransformerConfig",
    "Variable",
    "__version__",
    "cached_bytes",
    "chat_template",
    "checkpoint",
    "checkpoint_sequential",
    "devices",
    "empty_cache",
    "enable_grad",
    "functional",
    "get_rng_state",
    "gguf_tensor_infos",
    "instruct",
    "instruct_corpus",
    "is_grad_enabled",
    "manual_seed",
    "matmul",
    "memory_stats",
    "named",
    "nn",
    "no_grad",
    "normal",
    "num_threads",
    "optim",
    "plotting",
    "parse_activation_checkpointing",
    "parse_byte_size",
    "peak_memory_breakdown",
    "quantize",
    "dequantize",
    "read_gguf_metadata",
    "read_gguf_tensor",
    "reset_peak_memory_stats",
    "set_grad_enabled",
    "set_rng_state",
    "simd_level",
    "synchronize",
    "tensor",
    "uniform",
    "load_model",
    "load_tokenizer",
    "gguf_tokenizer",
    "tokenizer",
]
__all__ += training.configs.__all__
__all__ += data.text.__all__
__all__ += generation.__all__
__all__ += training.stages.__all__
