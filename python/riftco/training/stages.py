"""Stage pipelines: :func:`run_pretraining` and :func:`run_post_training`.

Each stage trains with Adam (AdamW when ``weight_decay > 0``) on byte-level batches sampled from
a corpus, and writes into ``out_dir``:

- ``model.safetensors`` + ``config.json`` (the model state, Hugging Face Llama layout) — for
  pretraining and full fine-tuning; ``adapter/`` (PEFT layout) for LoRA post-training;
- ``training_metadata.json``: stage, configs, activation-checkpointing policy (its canonical
  spelling, ``activation_checkpointing``), the device trained on (``device``, the resolved name:
  ``"cpu"``, ``"vulkan"``, ``"metal"``) and the per-block plan it resolved to for the training
  batch shape (``activation_checkpointing_plan``: the dict of
  ``DecoderOnlyTransformer.activation_checkpointing_plan``, computed once before the first step,
  with the planner's measurements for ``auto`` and budgets), attention kind, optimizer, corpus
  summary, the dropout probabilities and dropout step (``dropout``; the step is the position in
  the mask stream, not model state, updated at every save), per-step losses, learning rates and
  step times, tokens/s, peak
  memory by category (``riftco.memory_stats()``; the peak is reset at the start of every step and
  the maximum over steps is recorded), validation loss before and after, wall time;
- per step (:mod:`riftco.training.run_records`): ``memory_per_step`` (each category's peak bytes
  in that step and the buffer pool's cached bytes after it) and ``validation_losses`` (step 0, every
  ``eval_every`` steps, the last step);
- ``loss.png`` and ``memory.png`` (:func:`riftco.training.plotting.write_plots`) at the end of a
  complete run when ``plots`` is true and matplotlib is installed (``pip install 'riftco[plot]'``);
  without matplotlib the ``log`` callback gets one line saying so and the run still succeeds.

Saves happen every ``save_every`` steps, at the end and on Ctrl-C: each writes a training-state
checkpoint ``checkpoints/step-NNNNNNNN/`` (see :mod:`riftco.training.state`; the newest
``keep_checkpoints`` are kept), then the model files and the metadata at the folder's top level,
each file written atomically (temporary file, fsync, rename). ``resume=True`` continues a run from
its newest checkpoint exactly (bitwise, on the same machine and thread count). Ctrl-C takes
effect once the step in progress (its validation pass and save included) is done: the stage
writes a checkpoint of that step and raises :class:`TrainingInterrupted` (a
``KeyboardInterrupt``) carrying its step.

SIGINT: for the whole run (main thread) the stage installs its own handler, whatever the
process inherited — also when SIGINT was ignored, as in a job a shell started in the background
— and restores the previous handler when the run ends. The first SIGINT interrupts (at once, or
after the save in progress); any further one while that interruption is handled is ignored.
``training_metadata.json`` is written with mode ``0644``, like the model files.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from riftco._native import (
    ACTIVATION_CHECKPOINTING_POLICIES,
    ATTENTION_KINDS,
    ConfigError,
    DecoderOnlyTransformer,
    ModelStateError,
    TransformerConfig,
    __version__,
    num_threads,
    simd_level,
)
from riftco.training.configs import HALF_DTYPES, PostTrainingConfig, PretrainingConfig, _LoopConfig
from riftco.data.text import VOCAB_SIZE, Corpus, CorpusError, check_corpus_fits
from riftco.data.examples import ExampleBatchSampler, ExampleCorpus
from riftco.training.run_folder import (
    ADAPTER_DIR,
    METADATA_FILE,
    MODEL_STATE_FILE,
    SHARD_INDEX_FILE,
    Log,
    OutputDirError,
    TrainingInterrupted,
    _clear_checkpoints,
    _resume_checkpoint,
    prepare_out_dir,
)
from riftco.training.loop import UNIFORM_BASELINE_LOSS, _RunState, _Trainer
from riftco.training.replicas import _group, _writes_files
from riftco.training.state import (
    CHECKPOINTS_DIR,
    HARMLESS_TRAINING_KEYS,
    CheckpointWriteError,
    check_same_math,
)

__all__ = [
    "ADAPTER_DIR",
    "CheckpointWriteError",
    "METADATA_FILE",
    "MODEL_STATE_FILE",
    "OutputDirError",
    "TrainingInterrupted",
    "UNIFORM_BASELINE_LOSS",
    "load_model",
    "prepare_out_dir",
    "resolve_model_state",
    "run_post_training",
    "run_pretraining",
]


def _check_data(corpus: Corpus | ExampleCorpus, cfg: _LoopConfig) -> None:
    """A text corpus fits ``seq_len`` and the split; examples split and fit ``seq_len + 1``.

    Raises:
        CorpusError: naming what does not fit.
        ConfigError: ``packing`` with a text corpus.
    """
    if isinstance(corpus, ExampleCorpus):
        for part in corpus.split(cfg.validation_fraction):
            ExampleBatchSampler(part, cfg.batch_size, cfg.seq_len, 0)
        return
    if getattr(cfg, "packing", False):
        raise ConfigError(
            "packing = True needs a riftco.ExampleCorpus (instruction/chat examples); a text "
            "corpus is already cut into full rows without padding"
        )
    if not isinstance(corpus, Corpus):
        raise CorpusError(
            f"corpus must be a riftco.Corpus or riftco.ExampleCorpus; got {type(corpus).__name__}"
        )
    check_corpus_fits(corpus, cfg.seq_len, cfg.validation_fraction)


def _check_fits(
    model_config: TransformerConfig, cfg: _LoopConfig, byte_tokens: bool = True
) -> None:
    """Byte tokens need ``vocab_size >= 256``; a corpus of another tokenizer's ids (not
    ``uint8``) is checked id by id by the model's loss."""
    if byte_tokens and model_config.vocab_size < VOCAB_SIZE:
        raise ConfigError(
            f"vocab_size must be >= {VOCAB_SIZE} for byte-level tokens; "
            f"got {model_config.vocab_size}"
        )
    if cfg.seq_len > model_config.max_seq_len:
        raise ConfigError(
            f"seq_len {cfg.seq_len} exceeds the model's max_seq_len {model_config.max_seq_len}"
        )


def _corpus_identity(corpus: Corpus | ExampleCorpus) -> dict[str, Any]:
    if isinstance(corpus, ExampleCorpus):
        return {"examples": len(corpus), "sha256": corpus.fingerprint()}
    return {
        "bytes": int(corpus.tokens.nbytes),
        "dtype": str(corpus.tokens.dtype),
        "sha256": hashlib.sha256(np.ascontiguousarray(corpus.tokens).tobytes()).hexdigest(),
    }


def _file_identity(path: str | None) -> dict[str, Any] | None:
    """A model file's path, size and modification time (a changed base model is detected
    without reading it)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return {"path": path}
    return {"path": path, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def _math_settings(
    stage: str,
    model: DecoderOnlyTransformer,
    cfg: _LoopConfig,
    corpus: Corpus | ExampleCorpus,
    base_model: str | None = None,
) -> dict[str, Any]:
    """Every setting that changes what a run computes: a resume must match all of them."""
    training = {k: v for k, v in cfg.to_dict().items() if k not in HARMLESS_TRAINING_KEYS}
    training["device"] = model.device
    settings: dict[str, Any] = {
        "stage": stage,
        "riftco_version": __version__,
        "model_config": model.config.to_dict(),
        "training_config": training,
        "corpus": _corpus_identity(corpus),
        "base_model": _file_identity(base_model),
        "num_threads": num_threads(),
        "simd_level": simd_level(),
    }
    group = _group(cfg)
    if group is not None:
        # The ranks and the stage change the sums and the dropout masks: a resume needs both.
        settings["data_parallel"] = {
            "world_size": group.world_size,
            "zero": cfg.zero,
            "bucket_bytes": cfg.data_parallel_bucket_bytes,
        }
    return settings


def run_pretraining(
    model_config: TransformerConfig,
    pretraining_config: PretrainingConfig,
    corpus: Corpus,
    out_dir: str | os.PathLike[str],
    progress: bool = True,
    log: Log | None = None,
    plots: bool = True,
    *,
    resume: bool | str | os.PathLike[str] = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Trains a fresh ``DecoderOnlyTransformer(model_config, ...)`` on ``corpus``.

    Writes ``model.safetensors``, ``config.json`` and ``training_metadata.json`` into
    ``out_dir`` (see the module docstring) and returns the metadata dict. ``progress`` shows a
    tqdm bar; otherwise ``log`` (when given) receives a line every ``log_every`` steps. ``plots``
    writes ``loss.png`` and ``memory.png`` at the end when matplotlib is installed.

    Every ``save_every`` steps, at the end and on Ctrl-C the run writes a training-state
    checkpoint into ``out_dir/checkpoints/`` (see :mod:`riftco.training.state`). ``resume=True``
    continues from the newest complete one (or starts at step 0 when ``out_dir`` holds no run
    yet); a path resumes from that checkpoint folder or run folder. A resumed run computes
    exactly what the uninterrupted run would have (bitwise, on the same machine with the same
    thread count): settings that would change that are refused. A folder that already holds a
    run is refused unless ``resume`` or ``overwrite`` (which replaces it) is given.

    Raises:
        ConfigError: ``seq_len`` above ``max_seq_len``, ``vocab_size < 256``, a checkpointing
            policy that does not fit the model (``segments:K`` with K above ``n_layers``, a
            per-block list of another length), or a budget below the smallest achievable peak
            (the message names it); all raised before ``out_dir`` is created.
        OutputDirError: ``out_dir`` cannot be written.
        CorpusError: the corpus is too small for ``seq_len`` (the message names the sizes and
            what fits), raised before ``out_dir`` is created.
        DeviceUnavailableError: the config's GPU has no adapter (before ``out_dir`` exists).
        OutputDirError: also when ``out_dir`` holds a run and neither ``resume`` nor
            ``overwrite`` is given.
        ConfigError: on resume, a setting that changes the math differs from the checkpoint's
            (every difference named with both values).
        ModelStateError: on resume, a missing, truncated or mismatched checkpoint file (named).
        CheckpointWriteError: a checkpoint cannot be written (disk full, read-only folder): the
            previous checkpoint stays loadable.
        TrainingInterrupted: on Ctrl-C, after the step in progress and its checkpoint.
        MPIUnavailableError: ``data_parallel`` without mpi4py (see
            :mod:`riftco.training.distributed`).
        RankMismatchError: the ranks of a data-parallel run differ in a setting or the data.
    """
    cfg = pretraining_config
    _check_fits(model_config, cfg)
    check_corpus_fits(corpus, cfg.seq_len, cfg.validation_fraction)
    # The model and its plan before the output folder: a policy that does not fit the model or
    # a budget below the smallest achievable peak fails with nothing created.
    model = DecoderOnlyTransformer(
        model_config,
        attention=cfg.attention,
        activation_checkpointing=cfg.activation_checkpointing,
        activation_memory_budget=cfg.activation_memory_budget,
    )
    if cfg.device is not None:
        model.to(cfg.device)
    model.loss_chunk_bytes = cfg.loss_chunk_bytes
    model.activation_checkpointing_plan(cfg.batch_size, cfg.seq_len)
    checkpoint = _resume_checkpoint(Path(out_dir), resume, overwrite, log)
    math_settings = _math_settings("pretraining", model, cfg, corpus)
    if checkpoint is not None:
        check_same_math(checkpoint.state["math"], math_settings, checkpoint.path)
    out = prepare_out_dir(out_dir)
    if _writes_files(cfg):
        _clear_checkpoints(out, overwrite)
    metadata: dict[str, Any] = {
        "model_config": model_config.to_dict(),
        "files": [MODEL_STATE_FILE, "config.json", METADATA_FILE, CHECKPOINTS_DIR],
    }
    return _Trainer(
        stage="pretraining",
        model=model,
        params=list(model.parameters()),
        cfg=cfg,
        corpus=corpus,
        out_dir=out,
        run=_RunState(
            save_model=lambda folder: model.save(str(folder / MODEL_STATE_FILE)),
            load_model=lambda folder: model.load_weights(str(folder / MODEL_STATE_FILE)),
            publish=lambda: model.save(str(out / MODEL_STATE_FILE)),
            math=math_settings,
            resume_from=checkpoint,
        ),
        metadata=metadata,
        progress=progress,
        log=log,
        plots=plots,
    ).train()


def resolve_model_state(model_path: str | os.PathLike[str]) -> Path:
    """``model_path`` itself when a file; for a folder its ``model.safetensors``, else its
    ``model.safetensors.index.json`` (a sharded Hugging Face checkpoint).

    Raises:
        ModelStateError: when none exists (naming the path and the files looked for).
    """
    path = Path(model_path)
    if path.is_dir():
        for name in (MODEL_STATE_FILE, SHARD_INDEX_FILE):
            if (path / name).is_file():
                return path / name
        raise ModelStateError(
            f"no model state at {str(path)!r}: the folder has neither {MODEL_STATE_FILE} nor "
            f"{SHARD_INDEX_FILE}; pass a pretraining output folder or a Hugging Face model folder"
        )
    if not path.is_file():
        raise ModelStateError(
            f"no model state at {str(path)!r}: pass the output folder of a pretraining run or a "
            "model.safetensors file (`riftco pretrain` writes runs/pretrain)"
        )
    return path


def load_model(
    model_path: str | os.PathLike[str],
    attention: str = ATTENTION_KINDS[0],
    activation_checkpointing: str | list[str] | tuple[str, ...] = (
        ACTIVATION_CHECKPOINTING_POLICIES[0]
    ),
    activation_memory_budget: int | str | None = None,
    *,
    determinism_check: str = "metadata",
    dtype: str | None = None,
) -> DecoderOnlyTransformer:
    """Loads ``model.safetensors`` from a stage output folder, a plain Hugging Face Llama model
    folder (``config.json`` with ``model.safetensors`` or a sharded
    ``model.safetensors.index.json``; F32, BF16 or F16 tensors), or a given file: safetensors,
    or a GGUF file (llama.cpp) of the ``llama`` architecture (see ``DecoderOnlyTransformer.load``
    and docs/gguf.md).

    ``attention``, ``activation_checkpointing``, ``activation_memory_budget`` and
    ``determinism_check`` (``"off"``, ``"metadata"`` or ``"values"``) are those of
    :class:`riftco.DecoderOnlyTransformer` (the file records none of them). ``dtype``: ``None``
    (default) keeps a GGUF file's quantized blocks and 16-bit tensors as stored, the base then
    frozen (for LoRA), and reads anything else as float32; ``"float32"`` dequantizes (for full
    fine-tuning); ``"bfloat16"`` / ``"float16"`` reads the base weights straight into frozen
    16-bit storage; ``"nf4"``, ``"q8_0"``, ``"q4_0"``, ``"q4_k"``, ... quantize every base
    matrix on load, the base frozen (QLoRA; see
    ``DecoderOnlyTransformer.set_frozen_weights_dtype``).

    Raises:
        ModelStateError: no or invalid model state at the path.
        ConfigError: an unknown option or a policy that does not fit the saved model (named).
    """
    return DecoderOnlyTransformer.load(
        str(resolve_model_state(model_path)),
        attention=attention,
        activation_checkpointing=activation_checkpointing,
        activation_memory_budget=activation_memory_budget,
        determinism_check=determinism_check,
        dtype=dtype,
    )


def _model_settings(model: DecoderOnlyTransformer) -> Callable[[], None]:
    """A function that restores the device, attention kind, policy, loss chunking and dropout probabilities
    ``model`` has now (what :func:`run_post_training` changes before its first step)."""
    device = model.device
    attention = model.attention
    policy = model.activation_checkpointing
    loss_chunk_bytes = model.loss_chunk_bytes
    attention_dropout = model.config.attention_dropout
    residual_dropout = model.config.residual_dropout
    lora_dropout = model.lora_dropout if model.has_lora else None

    def restore() -> None:
        model.to(device)
        model.set_attention(attention)
        model.set_activation_checkpointing(policy)
        model.loss_chunk_bytes = loss_chunk_bytes
        model.set_dropout(
            attention_dropout=attention_dropout,
            residual_dropout=residual_dropout,
            lora_dropout=lora_dropout,
        )

    return restore


def _post_training_setup(
    model: DecoderOnlyTransformer,
    cfg: PostTrainingConfig,
    base_path: str | None,
    resume_from: Path | None,
) -> tuple[dict[str, Any], Callable[[Path], None], Callable[[Path], None]]:
    """Enables the adapters for ``"lora"`` (fresh, or those of the checkpoint ``resume_from``);
    returns the initial metadata and the functions that save the trained state into a folder
    and load it back from one."""
    metadata: dict[str, Any] = {
        "model_config": model.config.to_dict(),
        "base_model": base_path,
        "fine_tuning_method": cfg.fine_tuning_method,
    }
    save_state: Callable[[Path], None]
    load_state: Callable[[Path], None]
    if cfg.fine_tuning_method == "lora":
        if resume_from is None:
            model.enable_lora(
                rank=cfg.lora_rank,
                alpha=cfg.lora_alpha,
                mlp=cfg.lora_mlp,
                seed=cfg.lora_seed,
                dropout=cfg.lora_dropout,
            )
        else:
            # The checkpoint's adapters (its settings are the config's: checked before).
            adapter = resume_from / ADAPTER_DIR
            try:
                model.load_lora(str(adapter))
            except (ConfigError, OSError) as e:
                raise ModelStateError(f"{str(adapter)!r}: {e}") from None
        if cfg.frozen_weights_dtype is not None:
            model.set_frozen_weights_dtype(cfg.frozen_weights_dtype)
        metadata["lora"] = {
            "rank": cfg.lora_rank,
            "alpha": cfg.lora_alpha,
            "mlp": cfg.lora_mlp,
            "dropout": cfg.lora_dropout,
            "frozen_weights_dtype": model.frozen_weights_dtype,
        }
        metadata["files"] = [ADAPTER_DIR, METADATA_FILE, CHECKPOINTS_DIR]

        def save_state(folder: Path) -> None:
            model.save_lora(str(folder / ADAPTER_DIR))

        def load_state(folder: Path) -> None:
            pass  # the checkpoint's adapters were loaded in place of fresh ones above

    else:
        metadata["files"] = [MODEL_STATE_FILE, "config.json", METADATA_FILE, CHECKPOINTS_DIR]

        def save_state(folder: Path) -> None:
            model.save(str(folder / MODEL_STATE_FILE))

        def load_state(folder: Path) -> None:
            model.load_weights(str(folder / MODEL_STATE_FILE))

    return metadata, save_state, load_state


def run_post_training(
    model_or_path: DecoderOnlyTransformer | str | os.PathLike[str],
    post_training_config: PostTrainingConfig,
    corpus: Corpus | ExampleCorpus,
    out_dir: str | os.PathLike[str],
    progress: bool = True,
    log: Log | None = None,
    base_model: str | os.PathLike[str] | None = None,
    plots: bool = True,
    *,
    resume: bool | str | os.PathLike[str] = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Fine-tunes a pretrained model on ``corpus``.

    ``model_or_path`` is a model (moved to the config's ``device`` when not ``None``, its
    attention kind and policy set to the config's, its dropout probabilities to the config's
    that are not ``None``, and with LoRA it gains adapters: the object is modified) or a
    pretraining output folder / ``model.safetensors`` path (loaded with the config's attention
    and policy, then moved to its device). ``base_model`` names where a given
    model object came from, for the metadata. Everything that does not need the adapters is
    checked before a given model changes, and when a later check fails (a budget that fits the
    base model but not with the adapters, an unwritable ``out_dir``) its device, attention
    kind, policy and dropout probabilities are restored; adapters already added stay (they cannot be
    removed). The steps train in training mode; the model's mode is restored afterwards.

    With ``fine_tuning_method="lora"`` adapters are enabled and only they are trained (base
    weights frozen and unchanged); ``adapter/`` is written in PEFT layout. With ``"full"`` every
    parameter is trained and ``model.safetensors`` + ``config.json`` are written. Both write
    ``training_metadata.json`` (and ``loss.png``, ``memory.png`` as :func:`run_pretraining`
    with ``plots``); returns the metadata dict.

    Checkpoints, ``resume`` and ``overwrite`` as :func:`run_pretraining`; a resumed LoRA run
    loads the base model as the interrupted one did (the base file's path, size and
    modification time must match) and the adapters from the checkpoint.

    Raises:
        ModelStateError: no or invalid model state at the path; on resume, a missing, truncated
            or mismatched checkpoint file (named).
        ConfigError: as :func:`run_pretraining`.
        OutputDirError: as :func:`run_pretraining`.
        CorpusError: as :func:`run_pretraining`.
        DeviceUnavailableError: as :func:`run_pretraining`.
        CheckpointWriteError: as :func:`run_pretraining`.
        TrainingInterrupted: as :func:`run_pretraining`.
        MPIUnavailableError: ``data_parallel`` without mpi4py (see
            :mod:`riftco.training.distributed`).
        RankMismatchError: the ranks of a data-parallel run differ in a setting or the data.
    """
    cfg = post_training_config
    base_path = None if base_model is None else str(base_model)
    _check_data(corpus, cfg)
    byte_tokens = isinstance(corpus, Corpus) and corpus.tokens.dtype == np.uint8
    if isinstance(model_or_path, DecoderOnlyTransformer):
        model = model_or_path
        # Checked before the model changes; what is set below is undone if a later check fails.
        _check_fits(model.config, cfg, byte_tokens)
        undo = _model_settings(model)
    else:
        base_path = str(resolve_model_state(model_or_path))
        model = load_model(
            base_path,
            cfg.attention,
            cfg.activation_checkpointing,
            activation_memory_budget=cfg.activation_memory_budget,
            # A compressed frozen base (LoRA only) loads into its storage; by default a GGUF's
            # quantized blocks stay as stored under LoRA, and full fine-tuning reads float32.
            dtype=cfg.frozen_weights_dtype
            or (None if cfg.fine_tuning_method == "lora" else "float32"),
        )
        if (
            cfg.device is not None
            and cfg.device.lower() != "cpu"
            and cfg.frozen_weights_dtype is None
            and model.frozen_weights_dtype in HALF_DTYPES
        ):
            # A GGUF's F16 / BF16 matrices: 16-bit storage lives on the CPU only.
            model.set_frozen_weights_dtype("float32")
        _check_fits(model.config, cfg, byte_tokens)
        undo = None
    try:
        if cfg.device is not None:
            # First, so that the adapters are created on the device.
            model.to(cfg.device)
        model.set_attention(cfg.attention)
        model.loss_chunk_bytes = cfg.loss_chunk_bytes
        model.set_activation_checkpointing(
            cfg.activation_checkpointing, activation_memory_budget=cfg.activation_memory_budget
        )
        # None keeps the model's own probability (the one saved with a loaded model).
        model.set_dropout(
            attention_dropout=cfg.attention_dropout, residual_dropout=cfg.residual_dropout
        )
        # Read-only checks of the run folder and of a resume's settings first: nothing below
        # (the adapters, which cannot be removed again) happens when they fail.
        checkpoint = _resume_checkpoint(Path(out_dir), resume, overwrite, log)
        stage = f"post_training_{cfg.fine_tuning_method}"
        math_settings = _math_settings(stage, model, cfg, corpus, base_path)
        if checkpoint is not None:
            check_same_math(checkpoint.state["math"], math_settings, checkpoint.path)
        if cfg.fine_tuning_method == "lora" and model.activation_checkpointing.startswith(
            "budget:"
        ):
            # A budget the base model alone exceeds fails here, before the adapters (which
            # cannot be removed again) exist.
            model.activation_checkpointing_plan(cfg.batch_size, cfg.seq_len)
        metadata, save_state, load_state = _post_training_setup(
            model, cfg, base_path, None if checkpoint is None else checkpoint.path
        )
        # Planned (with the adapters, which change the plan) before the output folder exists,
        # as in run_pretraining.
        model.activation_checkpointing_plan(cfg.batch_size, cfg.seq_len)
        out = prepare_out_dir(out_dir)
        if _writes_files(cfg):
            _clear_checkpoints(out, overwrite, writes_adapter=cfg.fine_tuning_method == "lora")
    except BaseException:
        if undo is not None:
            undo()
        raise
    return _Trainer(
        stage=stage,
        model=model,
        params=list(model.parameters()),
        cfg=cfg,
        corpus=corpus,
        out_dir=out,
        run=_RunState(
            save_model=save_state,
            load_model=load_state,
            publish=lambda: save_state(out),
            math=math_settings,
            resume_from=checkpoint,
        ),
        metadata=metadata,
        progress=progress,
        log=log,
        plots=plots,
    ).train()
