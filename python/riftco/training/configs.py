"""Stage configurations: :class:`PretrainingConfig` and :class:`PostTrainingConfig`.

Both are frozen dataclasses taking keyword arguments only, validated on construction: an invalid
choice string raises :class:`riftco.ConfigError` listing the valid ones, a non-positive (or
otherwise out-of-range) number raises it naming the field and the value.

``activation_checkpointing`` takes every spelling the model takes (checked by the native parser,
:func:`riftco.parse_activation_checkpointing`; a per-block list is one comma-separated string
here), and ``activation_memory_budget`` a byte budget for the planner (an int of bytes or a size
string such as ``"64MiB"``, only with ``activation_checkpointing="disabled"``). What a policy
does not know without the model (``segments:K`` with K above ``n_layers``, a per-block list of
the wrong length, a budget below the smallest achievable peak) is reported when the stage builds
the model or plans its first step, as a :class:`riftco.ConfigError` naming the value.

The learning-rate schedule (``lr_schedule``) is a linear warm-up from ``lr / warmup_steps`` to
``lr`` over the first ``warmup_steps`` steps, then either ``"cosine"`` decay to
``lr * min_lr_ratio`` at the last step or ``"constant"`` ``lr``. The optimizer is
:class:`riftco.Adam` when ``weight_decay == 0`` and :class:`riftco.AdamW` (decoupled weight decay,
Loshchilov & Hutter 2019) otherwise.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from typing import Any

from riftco._native import (
    ACTIVATION_CHECKPOINTING_FORMS,
    ACTIVATION_CHECKPOINTING_POLICIES,
    ATTENTION_KINDS,
    DEFAULT_LOSS_CHUNK_BYTES,
    DEVICES,
    ConfigError,
    parse_activation_checkpointing,
    parse_byte_size,
)
from riftco._native import check_probability as _check_probability

# ATTENTION_KINDS comes from the Rust option table, ACTIVATION_CHECKPOINTING_POLICIES (the policy
# names without a parameter) and ACTIVATION_CHECKPOINTING_FORMS (every accepted form) from the
# Rust policy spellings; default first. The options below exist only in this package's stage
# runners; each tuple is their one table.
FINE_TUNING_METHODS: tuple[str, ...] = ("lora", "full")
FROZEN_WEIGHTS_DTYPES: tuple[str, ...] = (
    "float32",
    "bfloat16",
    "float16",
    "nf4",
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    "q2_k",
    "q3_k",
    "q4_k",
    "q5_k",
    "q6_k",
)
"""The storage formats of a frozen base: float32, 16 bits, or a block-quantized format (QLoRA's
NF4, llama.cpp's Q8_0 ... Q6_K)."""
HALF_DTYPES: tuple[str, ...] = ("bfloat16", "float16")
"""The 16-bit formats of ``FROZEN_WEIGHTS_DTYPES``: they live on the CPU only (a GPU model keeps
its frozen base in float32 or a quantized format)."""
LR_SCHEDULES: tuple[str, ...] = ("cosine", "constant")

__all__ = [
    "ACTIVATION_CHECKPOINTING_FORMS",
    "ACTIVATION_CHECKPOINTING_POLICIES",
    "ATTENTION_KINDS",
    "DEFAULT_LOSS_CHUNK_BYTES",
    "DEVICES",
    "FINE_TUNING_METHODS",
    "FROZEN_WEIGHTS_DTYPES",
    "HALF_DTYPES",
    "LR_SCHEDULES",
    "PostTrainingConfig",
    "PretrainingConfig",
]


def _check_choice(field: str, value: object, valid: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in valid:
        choices = ", ".join(repr(v) for v in valid)
        raise ConfigError(f"{field} must be one of {choices}; got {value!r}")


def _check_policy(policy: object, budget: int | str | None) -> None:
    """Checks ``activation_checkpointing`` and ``activation_memory_budget`` with the native
    parser (the model's own); its ``ConfigError`` names the value and what is accepted."""
    if not isinstance(policy, str):
        raise ConfigError(
            f"activation_checkpointing must be a policy string ({ACTIVATION_CHECKPOINTING_FORMS}; "
            f"a per-block list is one comma-separated string here); got {policy!r}"
        )
    parse_activation_checkpointing(policy, budget)


def _check_size(field: str, value: object) -> int:
    """A byte size setting: a positive int of bytes (an ``__index__`` integer, not a bool) or a
    size string (``"256MiB"``), as a plain int; ``ConfigError`` naming ``field`` otherwise."""
    if isinstance(value, str):
        try:
            size = parse_byte_size(value)
        except ConfigError as e:
            raise ConfigError(str(e).replace("activation_memory_budget", field)) from None
    elif isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ConfigError(
            f"{field} must be an int of bytes or a size string such as '256MiB'; got {value!r}"
        )
    else:
        size = operator.index(value)
    if not 1 <= size < 2**64:
        raise ConfigError(f"{field} must be at least 1 byte and below 2^64 bytes; got {value!r}")
    return size


def _check_zero3(cfg: Any) -> None:
    """ZeRO-3's limits: the shards live in host memory, and a plan chosen by running every
    block would need every parameter gathered."""
    policy = cfg.activation_checkpointing.strip()
    budget = cfg.activation_memory_budget
    if policy == "auto" or policy.startswith("budget") or budget is not None:
        setting = (
            f"activation_memory_budget={budget!r}"
            if budget is not None
            else f"activation_checkpointing={policy!r}"
        )
        raise ConfigError(
            f"zero=3 with {setting}: a policy that chooses its plan by running every block "
            "needs every parameter gathered at once; use disabled, block, segments:K, a "
            "selective policy or a per-block list, without a memory budget"
        )
    if cfg.device is not None and cfg.device.lower() != "cpu":
        raise ConfigError(
            f"zero=3 keeps the parameter shards in host memory; got device={cfg.device!r}: "
            "train on the cpu"
        )


def _check_int(field: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{field} must be an integer; got {value!r}")
    if value < minimum:
        bound = "positive" if minimum == 1 else f">= {minimum}"
        raise ConfigError(f"{field} must be {bound}; got {value!r}")


def _check_float(
    field: str, value: object, *, low: float, high: float = math.inf, low_open: bool = True
) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{field} must be a number; got {value!r}")
    v = float(value)
    ok = math.isfinite(v) and (v > low if low_open else v >= low) and v <= high
    if not ok:
        if low == 0.0 and high == math.inf:
            want = "positive and finite" if low_open else "non-negative and finite"
        else:
            want = f"in {'(' if low_open else '['}{low}, {high}]"
        raise ConfigError(f"{field} must be {want}; got {value!r}")


def check_probability(field: str, value: object) -> float:
    """A dropout probability, by the rule ``TransformerConfig`` applies (the native check): a
    real number (NumPy scalars included; not a bool), finite, ``0 <= p < 1``, and below 1 also
    as a 32-bit float (the model stores float32: ``0.99999999`` rounds to 1 and is refused).

    Returns:
        float: the value as a Python float.

    Raises:
        ConfigError: naming ``field`` and the value as given.
    """
    return _check_probability(field, value)


def check_loss_chunk_bytes(value: object) -> int | None:
    """A ``loss_chunk_bytes`` setting: ``None`` (whole logits), a positive int of bytes (or an
    ``__index__`` integer such as a NumPy integer; not a bool) or a size string (``"64MiB"``).

    Returns:
        int | None: bytes as a plain int, or ``None``.

    Raises:
        ConfigError: naming ``loss_chunk_bytes`` and the value, for 0, a negative or fractional
            size, a float, a bool, an unknown unit or a size of 2**64 bytes or more.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            size = parse_byte_size(value)
        except ConfigError as e:
            # The parser names the budget setting; say which setting this is.
            message = str(e).replace("activation_memory_budget", "loss_chunk_bytes")
            raise ConfigError(message) from None
    elif isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ConfigError(
            f"loss_chunk_bytes must be an int of bytes, a size string such as '64MiB', or None "
            f"(whole logits); got {value!r}"
        )
    else:
        size = operator.index(value)
    if not 1 <= size < 2**64:
        raise ConfigError(
            f"loss_chunk_bytes must be a size of at least 1 byte and below 2^64 bytes (such as "
            f"64MiB), or none for whole logits; got {value!r}"
        )
    return size


@dataclass(frozen=True, kw_only=True)
class _LoopConfig:
    """Fields shared by both stages (documented on the subclasses)."""

    activation_checkpointing: str = ACTIVATION_CHECKPOINTING_POLICIES[0]
    activation_memory_budget: int | str | None = None
    loss_chunk_bytes: int | str | None = DEFAULT_LOSS_CHUNK_BYTES
    attention: str = ATTENTION_KINDS[0]
    steps: int = 300
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 3e-3
    warmup_steps: int = 30
    lr_schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    seed: int = 0
    log_every: int = 10
    save_every: int = 100
    keep_checkpoints: int = 3
    eval_batches: int = 4
    eval_every: int | None = None
    validation_fraction: float = 0.05
    device: str | None = None
    data_parallel: bool = False
    zero: int = 0
    data_parallel_timeout_s: float = 600.0
    data_parallel_bucket_bytes: int = 25 * 2**20
    zero3_gather_budget: int | str | None = None

    def __post_init__(self) -> None:
        if self.device is not None:
            # Case-insensitive, like model.to: the check is on the lower-case spelling.
            name = self.device.lower() if isinstance(self.device, str) else self.device
            _check_choice("device", name, DEVICES)
        _check_policy(self.activation_checkpointing, self.activation_memory_budget)
        budget = self.activation_memory_budget
        if budget is not None and not isinstance(budget, str):
            # Accepted by the parser, so an int or an __index__ integer (a NumPy integer): kept
            # as a plain int, so that to_dict() stays JSON-native.
            object.__setattr__(self, "activation_memory_budget", operator.index(budget))
        object.__setattr__(self, "loss_chunk_bytes", check_loss_chunk_bytes(self.loss_chunk_bytes))
        _check_choice("attention", self.attention, ATTENTION_KINDS)
        _check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        for name in (
            "steps",
            "batch_size",
            "seq_len",
            "log_every",
            "save_every",
            "keep_checkpoints",
            "eval_batches",
        ):
            _check_int(name, getattr(self, name), 1)
        _check_int("warmup_steps", self.warmup_steps, 0)
        if self.eval_every is not None:
            _check_int("eval_every", self.eval_every, 1)
        _check_int("seed", self.seed, 0)
        _check_float("lr", self.lr, low=0.0)
        _check_float("min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0, low_open=False)
        _check_float("weight_decay", self.weight_decay, low=0.0, low_open=False)
        _check_float("validation_fraction", self.validation_fraction, low=0.0, high=0.5)
        if not isinstance(self.data_parallel, bool):
            raise ConfigError(f"data_parallel must be True or False; got {self.data_parallel!r}")
        if isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"zero must be 0, 1, 2 or 3 (the ZeRO stage); got {self.zero!r}")
        if self.zero and not self.data_parallel:
            raise ConfigError(
                f"zero={self.zero} shards the optimizer over data-parallel ranks: it needs "
                "data_parallel=True"
            )
        budget = self.zero3_gather_budget
        if budget is not None:
            if self.zero != 3:
                raise ConfigError(
                    f"zero3_gather_budget={budget!r} bounds ZeRO-3's gathered units: it needs "
                    f"zero=3; got zero={self.zero}"
                )
            object.__setattr__(
                self, "zero3_gather_budget", _check_size("zero3_gather_budget", budget)
            )
        if self.zero == 3:
            _check_zero3(self)
        _check_float("data_parallel_timeout_s", self.data_parallel_timeout_s, low=0.0)
        _check_int("data_parallel_bucket_bytes", self.data_parallel_bucket_bytes, 4)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (recorded in ``training_metadata.json``)."""
        return dataclasses.asdict(self)

    def lr_at(self, step: int) -> float:
        """Learning rate for 0-based ``step`` (see the module docstring for the schedule)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.lr_schedule == "constant":
            return self.lr
        decay_steps = self.steps - self.warmup_steps
        if decay_steps <= 1:
            return self.lr
        progress = (step - self.warmup_steps) / (decay_steps - 1)
        floor = self.lr * self.min_lr_ratio
        return floor + 0.5 * (self.lr - floor) * (1.0 + math.cos(math.pi * min(progress, 1.0)))


@dataclass(frozen=True, kw_only=True)
class PretrainingConfig(_LoopConfig):
    """How :func:`riftco.run_pretraining` trains a fresh model on byte-level text.

    Attributes:
        attention: ``"flash"`` (FlashAttention-2, O(seq) memory) or ``"materialized"``.
        activation_checkpointing: which activations the training forward keeps (it changes
            memory and time, never the loss or the weights; recorded in the metadata, with the
            resolved per-block plan, but not in the model state): ``"disabled"`` (keep
            everything), ``"block"`` (recompute each transformer block during backward),
            ``"segments:K"`` (K blocks per checkpoint, ``1 <= K <= n_layers``), ``"auto"`` (K
            from measured bytes, ``sqrt(n_layers * M_ckpt / M_layer)``), ``"selective"`` /
            ``"selective:NAME"`` (keep the values of a ``riftco.SELECTIVE_POLICIES`` entry,
            default ``"attention_ffn"``, recompute the rest), a comma-separated per-block list of
            ``"disabled"`` / ``"block"`` / ``"selective[:NAME]"`` (one per layer), or
            ``"budget:SIZE"``.
        activation_memory_budget: ``None``, or bytes (int) or a size string (``"64MiB"``): the
            planner picks per-block policies whose predicted peak activation bytes fit it, with
            the least predicted recompute time (only with ``activation_checkpointing`` left
            ``"disabled"``; a budget below the smallest achievable peak raises ``ConfigError``
            naming that peak before the first step). An integer budget of another type (a
            NumPy integer) is stored as a plain ``int``.
        loss_chunk_bytes: the workspace budget of the chunked LM head + cross-entropy (an int
            of bytes or a size string, stored as an int; default 64 MiB), or ``None`` for whole
            logits (see ``DecoderOnlyTransformer.loss_chunk_bytes``); it changes memory and
            time, not the loss (gradients within f32 rounding).
        steps: optimizer steps.
        batch_size: sequences per step; each is ``seq_len + 1`` tokens (inputs and targets).
        seq_len: tokens per sequence (at most the model's ``max_seq_len``).
        lr: peak learning rate; ``warmup_steps``, ``lr_schedule``, ``min_lr_ratio`` shape it.
        weight_decay: 0 selects Adam, a positive value AdamW with that decay.
        seed: seeds batch sampling (the model's initial weights use the model config's seed).
        log_every: steps between log lines / progress-bar updates of the loss.
        save_every: steps between saves (and always at the end and on Ctrl-C): each writes a
            training-state checkpoint ``checkpoints/step-NNNNNNNN/`` (model or adapters,
            optimizer state, trainer state; see :mod:`riftco.training.state`) and updates the
            model files and metadata at the folder's top level.
        keep_checkpoints: how many of the newest checkpoints a run keeps (default 3, at least
            1); older ones are removed once a new one is complete.
        eval_batches: held-out batches for each validation loss.
        eval_every: steps between validation losses during training (recorded in the metadata's
            ``validation_losses``), or ``None`` (default): only before and after training.
        validation_fraction: tail fraction of the corpus held out for validation.
        device: where the model trains: ``"cpu"``, ``"vulkan"``, ``"metal"`` or ``"gpu"`` (the
            best adapter; see :func:`riftco.devices`), or ``None`` (default): ``"cpu"`` for
            pretraining, for post-training the given model's own device (``"cpu"`` for a
            path). A GPU without adapter raises ``DeviceUnavailableError`` before the output
            folder exists; the metadata's ``device`` records the device resolved to.
        data_parallel: train one replica per MPI process (started by ``mpiexec -n N``,
            ``mpirun`` or ``srun``; see :mod:`riftco.training.distributed`): each rank takes
            ``batch_size / N`` rows of every global batch (``batch_size`` must be a multiple of
            N) and the gradients are averaged. Rank 0 logs and saves. Needs ``mpi4py``
            (``pip install 'riftco[mpi]'``); without a launcher the run is one rank.
        zero: the ZeRO stage with ``data_parallel``: 0 (every rank holds the whole Adam state),
            1 (each rank holds the Adam moments of its ``1/N`` of the parameters), 2 (and
            receives only the gradient sums of its part), 3 (and holds only its part of the
            parameters, gathering a unit while the model computes with it; cpu only).
        data_parallel_timeout_s: seconds a rank waits in one collective before it aborts the
            job (a rank died or hangs).
        data_parallel_bucket_bytes: gradient bucket size (default 25 MiB, PyTorch DDP's): the
            gradients are exchanged bucket by bucket, and ZeRO shards each bucket over the
            ranks, so a ZeRO checkpoint resumes only with the same size.
        zero3_gather_budget: with ``zero=3``, ``None`` or the most bytes of units gathered
            ahead at once (an int, or a size string such as ``"256MiB"``): prefetches wait
            within it, a frozen embedding or LM head larger than it is given to the model by
            slices of vocabulary rows (a quarter of the budget each: the LoRA case), and any
            other unit larger than it is refused on every rank (``ShardingError``).
    """


@dataclass(frozen=True, kw_only=True)
class PostTrainingConfig(_LoopConfig):
    """How :func:`riftco.run_post_training` fine-tunes a pretrained model.

    Attributes (besides those of :class:`PretrainingConfig`, with smaller defaults):
        fine_tuning_method: ``"lora"`` (train low-rank adapters on q/k/v/o projections, and the
            MLP ones with ``lora_mlp``; base weights frozen; Hu et al. 2021) or ``"full"``.
        lora_rank: adapter rank r.
        lora_alpha: adapter scale numerator (the update is ``alpha / r · B A x``).
        lora_mlp: also adapt the gate/up/down projections.
        lora_seed: seeds the adapters' A initialisation (B starts at zero).
        attention_dropout: dropout probability on the attention probabilities during
            fine-tuning, in ``[0, 1)``, or ``None`` (default): keep the model's own (the value
            saved with a loaded model). A number is set on the model (and saved with it by
            ``"full"``); the metadata records the value used (``dropout``).
        residual_dropout: dropout probability on the attention and MLP outputs before the
            residual adds, in ``[0, 1)``, or ``None`` (default, the model's); as
            ``attention_dropout``.
        frozen_weights_dtype: ``None`` (default: keep the model's format; for a path, the
            file's: a GGUF's quantized blocks stay quantized under LoRA, anything else loads as
            float32), ``"float32"``, ``"bfloat16"``, ``"float16"``, or a quantized format
            (``"nf4"``, ``"q8_0"``, ``"q4_0"``, ``"q4_k"``, ...; see
            ``FROZEN_WEIGHTS_DTYPES``): the storage of the frozen base weights under LoRA
            (anything but float32 only with ``"lora"``; bfloat16 and float16 only on the CPU,
            quantized formats on a GPU too); every op still computes in
            float32, dequantizing a block of a weight at a time (see
            ``DecoderOnlyTransformer.set_frozen_weights_dtype``); a path loads into that
            storage. A passed-in model keeps the format afterwards, like its adapters.
        lora_dropout: dropout probability on the adapters' inputs (PEFT's ``lora_dropout``,
            written to ``adapter_config.json``), in ``[0, 1)``, default 0; only with ``"lora"``.
        packing: with an instruction/chat dataset, pack several whole examples into each
            training row (first fit; ``position_ids`` restart per example, so each computes as
            if alone) instead of padding one example per row (default ``False``).

    A probability is a real number (a NumPy scalar too, stored as a plain ``float``; not a bool),
    finite, in ``[0, 1)`` and below 1 also as a 32-bit float (the model's rule: ``0.99999999``
    is refused); otherwise ``ConfigError`` names the field and the value.

    Dropout is active in the training steps only: the validation losses are computed in
    evaluation mode. The per-forward masks follow the model's dropout step, recorded in the
    metadata (``dropout.dropout_step``) at every save.
    """

    fine_tuning_method: str = "lora"
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_mlp: bool = False
    lora_seed: int = 0
    attention_dropout: float | None = None
    residual_dropout: float | None = None
    lora_dropout: float = 0.0
    frozen_weights_dtype: str | None = None
    packing: bool = False
    steps: int = 100
    lr: float = 1e-3
    warmup_steps: int = 10
    save_every: int = 50

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("fine_tuning_method", self.fine_tuning_method, FINE_TUNING_METHODS)
        _check_int("lora_rank", self.lora_rank, 1)
        _check_float("lora_alpha", self.lora_alpha, low=0.0)
        _check_int("lora_seed", self.lora_seed, 0)
        if not isinstance(self.lora_mlp, bool):
            raise ConfigError(f"lora_mlp must be a bool; got {self.lora_mlp!r}")
        if not isinstance(self.packing, bool):
            raise ConfigError(f"packing must be a bool; got {self.packing!r}")
        for name in ("attention_dropout", "residual_dropout", "lora_dropout"):
            value = getattr(self, name)
            if value is not None or name == "lora_dropout":
                # Kept as a plain float (a NumPy scalar too), so that to_dict() stays JSON-native.
                object.__setattr__(self, name, check_probability(name, value))
        if self.frozen_weights_dtype is not None:
            if isinstance(self.frozen_weights_dtype, str):
                object.__setattr__(self, "frozen_weights_dtype", self.frozen_weights_dtype.lower())
            _check_choice("frozen_weights_dtype", self.frozen_weights_dtype, FROZEN_WEIGHTS_DTYPES)
        if self.frozen_weights_dtype not in (None, "float32"):
            if self.fine_tuning_method != "lora":
                raise ConfigError(
                    f"frozen_weights_dtype = {self.frozen_weights_dtype!r} needs "
                    f"fine_tuning_method 'lora' (trainable weights stay float32); got "
                    f"{self.fine_tuning_method!r}"
                )
            if (
                self.frozen_weights_dtype in HALF_DTYPES
                and self.device is not None
                and self.device.lower() != "cpu"
            ):
                raise ConfigError(
                    f"frozen_weights_dtype = {self.frozen_weights_dtype!r} stores the base on "
                    f"the CPU only (16-bit storage has no GPU path); got device "
                    f"{self.device!r} (use float32 or a quantized format such as 'nf4' or "
                    f"'q8_0' there)"
                )
        if self.lora_dropout != 0 and self.fine_tuning_method != "lora":
            raise ConfigError(
                f"lora_dropout = {self.lora_dropout!r} needs fine_tuning_method 'lora'; "
                f"got {self.fine_tuning_method!r}"
            )
