"""Type stubs for the PyO3 extension module ``riftco._native`` (hand-written; checked by
``python -m mypy.stubtest riftco._native``)."""

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import EllipsisType, NotImplementedType
from typing import Any, Protocol, SupportsIndex, TypeAlias, final

import numpy as np
import numpy.typing as npt

from . import functional as functional

__all__ = [
    "__version__",
    "ATTENTION_KINDS",
    "IGNORE_INDEX",
    "ACTIVATION_CHECKPOINTING_POLICIES",
    "ACTIVATION_CHECKPOINTING_FORMS",
    "SELECTIVE_POLICIES",
    "BLOCK_VALUE_NAMES",
    "DEFAULT_LOSS_CHUNK_BYTES",
    "DEVICES",
    "check_probability",
    "parse_byte_size",
    "parse_activation_checkpointing",
    "RiftcoError",
    "ShapeError",
    "IndexOutOfRangeError",
    "ConfigError",
    "TokenError",
    "DeviceUnavailableError",
    "DeviceMismatchError",
    "StaleGraphError",
    "CheckpointError",
    "ModelStateError",
    "LoraError",
    "DecodeError",
    "OutOfMemoryError",
    "num_threads",
    "simd_level",
    "synchronize",
    "matmul",
    "Variable",
    "tensor",
    "functional",
    "checkpoint",
    "named",
    "manual_seed",
    "get_rng_state",
    "set_rng_state",
    "uniform",
    "normal",
    "is_grad_enabled",
    "_set_grad_enabled",
    "_node_id",
    "TransformerConfig",
    "DecoderOnlyTransformer",
    "DecodeSession",
    "write_file_atomic",
    "Adam",
    "AdamW",
    "memory_stats",
    "_install_mirror_backend",
    "_move_leaves_",
    "cached_bytes",
    "devices",
    "empty_cache",
    "peak_memory_breakdown",
    "reset_peak_memory_stats",
    "read_gguf_metadata",
    "gguf_tensor_infos",
    "read_gguf_tensor",
    "quantize",
    "dequantize",
]

__version__: str

# The valid attention kinds, from the Rust option table (default first).
ATTENTION_KINDS: tuple[str, ...]

IGNORE_INDEX: int
"""``-100``: the label of a position that is not a target in ``DecoderOnlyTransformer.loss(
tokens, labels=...)`` (PyTorch's ``cross_entropy`` ``ignore_index`` default, Hugging Face's
label convention)."""

# The device names of the Python API, in the order devices() lists them.
DEVICES: tuple[str, ...]

# Activation-checkpointing policies (riftco_transformer::checkpointing).
ACTIVATION_CHECKPOINTING_POLICIES: tuple[str, ...]
"""The policies spelled by a name alone, default first: ``("disabled", "block", "auto",
"selective")`` (``"selective"`` is ``"selective:"`` + the first of ``SELECTIVE_POLICIES``). The
parameterised forms are listed in ``ACTIVATION_CHECKPOINTING_FORMS``."""
ACTIVATION_CHECKPOINTING_FORMS: str
"""Every accepted form, as error messages list them: ``"disabled"``, ``"block"``,
``"segments:K"``, ``"auto"``, ``"selective"``, ``"selective:NAME"``, a per-block list,
``"budget:SIZE"``."""
SELECTIVE_POLICIES: dict[str, tuple[str, ...]]
"""The named selective policies (``"selective:NAME"``): name -> the ``BLOCK_VALUE_NAMES`` it
keeps from the forward; the first is what plain ``"selective"`` means."""
DEFAULT_LOSS_CHUNK_BYTES: int
"""The default workspace budget of the chunked LM head + cross-entropy (64 MiB; see
``DecoderOnlyTransformer.loss_chunk_bytes``)."""
BLOCK_VALUE_NAMES: tuple[str, ...]
"""The values a transformer block names, in forward order (``"attn_norm"``, ``"q"``, ...,
``"swiglu"``); ``"selective:q+k+v"`` keeps the ones joined by ``+``."""

_Policy = str | list[str] | tuple[str, ...]
_Budget = SupportsIndex | str

def check_probability(field: str, value: object) -> float:
    """A dropout probability by the rule every riftco config applies: a real number (NumPy
    scalars included; not a bool), finite, ``0 <= p < 1`` and below 1 also as float32; returns
    it as a float. ``ConfigError`` naming ``field`` (``attention_dropout``, ``residual_dropout``,
    ``lora_dropout``, ``p``; other names read ``probability``) and the value as given."""

def parse_byte_size(text: str) -> int:
    """Bytes of a size string: a number with an optional unit ``B``, ``kB``, ``MB``, ``GB``,
    ``TB`` (powers of 1000) or ``KiB``, ``MiB``, ``GiB``, ``TiB`` (powers of 1024),
    case-insensitive (``"64MiB"`` -> 67108864); a decimal number with a unit is rounded down.
    ``ConfigError`` naming the text for an unknown unit, a missing or negative number, a
    fraction of a byte (``"1.5B"``), or 2**64 bytes or more."""

def parse_activation_checkpointing(
    policy: _Policy | None = None,
    activation_memory_budget: _Budget | None = None,
    *,
    n_layers: int | None = None,
) -> str:
    """The canonical spelling of a policy (``"selective"`` -> ``"selective:attention_ffn"``, a
    list -> its comma-separated form, a budget -> ``"budget:BYTES"``), checked as the model
    checks it (against ``n_layers`` when given). ``ConfigError`` naming the value."""

# ---------------------------------------------------------------------------------------------
# Exceptions: RiftcoError is the root; input problems are also ValueError, state and device
# problems RuntimeError, allocation failure MemoryError. Messages name the offending value.
# ---------------------------------------------------------------------------------------------

class RiftcoError(Exception):
    """Root of every riftco error (also raised for caught Rust panics)."""

class ShapeError(RiftcoError, ValueError):
    """Tensor shapes or element counts do not fit the operation."""

class IndexOutOfRangeError(ShapeError, IndexError):
    """An integer index outside -size..size of its axis (the message names the index, the axis
    and its size); also a ShapeError and an IndexError."""

class ConfigError(RiftcoError, ValueError):
    """An invalid configuration value or an unknown option string."""

class TokenError(RiftcoError, ValueError):
    """Token ids outside the vocabulary, or a bad token block layout."""

class DeviceUnavailableError(RiftcoError, RuntimeError):
    """The requested device does not exist in this build."""

class DeviceMismatchError(RiftcoError, RuntimeError):
    """The operands of one operation live on different devices; the message names both."""

class StaleGraphError(RiftcoError, RuntimeError):
    """A value read by a recorded graph changed before backward (run the forward again)."""

class CheckpointError(RiftcoError, RuntimeError):
    """A checkpoint() contract violation (boundary, dependencies, replay)."""

class ModelStateError(RiftcoError, ValueError):
    """A model-state or adapter file is malformed or does not match."""

class LoraError(RiftcoError, ValueError):
    """LoRA misuse: no adapters, adapters already present, bad rank or alpha."""

class DecodeError(RiftcoError, RuntimeError):
    """Decode-session misuse (for example a full K/V cache)."""

class OutOfMemoryError(RiftcoError, MemoryError):
    """A tensor, weight or cache could not be allocated (memory or an address-space limit ran
    out); the message names the operation and the bytes."""

def _error_kind_classes() -> dict[str, type[BaseException]]:
    """The classification table: each Rust error kind's name (``"shape"``, ``"tokens"``,
    ``"checkpoint"``, ...) and the exception class an error of that kind is raised as."""

# ---------------------------------------------------------------------------------------------
# Kernels on NumPy arrays
# ---------------------------------------------------------------------------------------------

def num_threads() -> int:
    """Number of worker threads the CPU kernels run on (``RIFTCO_NUM_THREADS``, honoured up to 4
    per logical CPU and at least 64, or the number of physical cores; at least 1)."""

def simd_level() -> str:
    """The instruction-set level the CPU kernels and matrix products run at: ``"avx512"``,
    ``"avx2"`` (AVX2 + FMA), ``"neon"`` or ``"scalar"``; ``RIFTCO_SIMD=scalar|avx2|avx512|neon``
    forces a level this CPU supports (``RIFTCO_FORCE_SCALAR=1``: ``scalar``). Raises
    ``ConfigError`` when ``RIFTCO_SIMD`` names a level this CPU lacks or no level."""

def matmul(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``a @ b`` for float32 arrays of shapes ``[m, k]`` and ``[k, n]``; returns ``[m, n]``.

    Raises ``ValueError`` when the inner dimensions differ, ``ShapeError`` when ``m·n``
    overflows, ``OutOfMemoryError`` when the output cannot be allocated, and ``TypeError`` when
    an argument is not a 2-D float32 array.
    """

def _move_leaves_(vars: list[Variable], device: str) -> None:
    """Moves the leaf Variables ``vars`` (and their gradients) to ``device`` in place, all or
    none (``Module.to``). ``ValueError`` for a Variable that is not a leaf."""

def _install_mirror_backend() -> None:
    """Registers the mirror test backend for ``"privateuseone"`` (CPU kernels behind the device
    seam; bitwise the CPU's results). For tests."""

def devices() -> list[dict[str, Any]]:
    """Every name of ``DEVICES`` (``cpu``, ``vulkan``, ``metal``, ``gpu``) probed, in that order:
    ``{"device", "available"}`` and, when available, ``resolved`` (``"gpu"`` names
    ``"vulkan"`` or ``"metal"``) and ``adapter`` (the GPU adapter, ``None`` for ``cpu``), else
    ``reason`` (what was looked for and what was found). Opens a GPU once, as ``model.to``."""

def synchronize(device: str | None = None) -> None:
    """Waits until every operation issued on ``device`` (a name of ``DEVICES`` or
    ``"privateuseone"``; ``None``: every device opened so far) has finished, like
    ``torch.cuda.synchronize()``: GPU kernels are submitted in batches and waited for only when
    a value is read on the host. ``ConfigError`` for an unknown name."""

def memory_stats(device: str = "cpu") -> dict[str, dict[str, int]]:
    """Current and peak bytes by category on ``device`` (each device has its own counters):
    keys ``parameter``, ``gradient``, ``optimizer_state``, ``activation``, ``workspace``,
    ``total`` (the peak of the sum), each ``{"current_bytes": int, "peak_bytes": int}``."""

def peak_memory_breakdown(device: str = "cpu") -> dict[str, int]:
    """Each category's bytes at the moment ``memory_stats()``'s total reached its peak (since
    the last reset): keys ``parameter``, ``gradient``, ``optimizer_state``, ``activation``,
    ``workspace``; they sum to the total peak."""

def read_gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Every metadata key of a GGUF file with its value (int, float, bool, str, or a list of
    them, nested for arrays of arrays); ``ModelStateError`` naming the field for a malformed
    header."""
def gguf_tensor_infos(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """One dict per tensor of a GGUF file: ``name``, ``type`` (GGML type name), ``shape``
    (NumPy order), ``n_bytes``, ``data_offset`` (in the file)."""
def read_gguf_tensor(path: str | os.PathLike[str], name: str) -> npt.NDArray[np.float32]:
    """Tensor ``name`` of a GGUF file dequantized to float32 (bitwise as
    ``gguf.quants.dequantize``), shape in NumPy order, rows as stored."""
def quantize(values: npt.ArrayLike, dtype: str) -> bytes:
    """``values`` (any shape, last axis a multiple of the block: 32, 64 for ``nf4``, 256 for
    ``q*_k``; converted to float32, C order) quantized to ``dtype`` (``"nf4"``, ``"q4_0"``,
    ``"q4_1"``, ``"q5_0"``, ``"q5_1"``, ``"q8_0"``, ``"q2_k"`` ... ``"q6_k"``): the bytes of the
    format's reference quantizer. Raises ``ConfigError`` (unknown dtype), ``ShapeError`` (last
    axis not whole blocks), ``ValueError`` (a NaN or infinite value)."""

def dequantize(data: bytes, dtype: str, shape: Sequence[int]) -> npt.NDArray[np.float32]:
    """The float32 values (shape ``shape``) of a tensor ``quantize`` stored in ``data``, bitwise
    as the reference dequantization. Raises ``ConfigError`` (unknown dtype), ``ShapeError``
    (last axis not whole blocks, or ``len(data)`` not the storage of ``prod(shape)``)."""

def reset_peak_memory_stats() -> None:
    """Sets every peak counter of ``memory_stats()`` to its current value."""

def cached_bytes() -> int:
    """Bytes of freed tensor buffers the buffer pool keeps for reuse (in no category)."""

def empty_cache() -> int:
    """Frees every buffer the pool caches; returns the bytes released."""

# ---------------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------------

_Operand: TypeAlias = Variable | float | npt.NDArray[Any]

@final
class Variable:
    """A graph node: a float32 value and, for op results, what backward needs.

    ``Variable(array, requires_grad=False, name=None)`` makes a leaf from any array-like
    (a C-contiguous float32 copy). Raises ``TypeError`` when ``array`` is not numeric.
    """

    def __new__(
        cls, array: npt.ArrayLike | Variable, requires_grad: bool = False, name: str | None = None
    ) -> Variable: ...
    def __getitem__(
        self, key: SupportsIndex | slice | EllipsisType | None | tuple[Any, ...], /
    ) -> Variable:
        """NumPy basic indexing (ints, slices with steps, ``...``, ``None``, tuples of these), a
        differentiable copy; the VJP scatters into zeros. ``IndexOutOfRangeError`` (an
        ``IndexError``) for an int out of range naming index, axis and size, and for more ints
        and slices than axes or two ``...``; ``TypeError`` for advanced indices (lists, arrays,
        bools); an exception raised by an index's ``__index__`` propagates."""
    @property
    def T(self) -> Variable:
        """All axes reversed (NumPy's ``.T``), a differentiable copy."""
    def transpose(self, dim0: int, dim1: int) -> Variable:
        """Swaps axes ``dim0`` and ``dim1`` (negative count from the end); ``ShapeError`` for an
        axis out of range."""
    def permute(self, *axes: int | Sequence[int]) -> Variable:
        """Reorders the axes: ``x.permute(2, 0, 1)`` or ``x.permute((2, 0, 1))``."""
    def reshape(self, *shape: int | Sequence[int]) -> Variable:
        """Another shape of the same elements: ``x.reshape(2, -1)`` or ``x.reshape((2, -1))``
        (one ``-1`` inferred)."""
    @property
    def device(self) -> str:
        """The device the value lives on (``"cpu"`` unless it belongs to a moved model or was
        copied with ``to``)."""
    def to(self, device: str) -> Variable:
        """This value on ``device`` (``"cpu"``, ``"vulkan"``, ``"metal"``, ``"gpu"``,
        ``"privateuseone"``): ``self`` when it is there already, else a copy. A leaf becomes a
        new leaf (same ``requires_grad`` and name); an op result a graph node whose backward
        copies the gradient back. ``ConfigError`` for an unknown name,
        ``DeviceUnavailableError`` when the GPU asked for has no adapter."""
    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the value."""
    @property
    def ndim(self) -> int:
        """``len(shape)``."""
    def dim(self) -> int:
        """``len(shape)`` (PyTorch's ``dim()``)."""
    def numpy(self) -> npt.NDArray[np.float32]:
        """A float32 NumPy copy of the value, of shape ``self.shape``; ``ShapeError`` for more
        than 32 axes."""
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> npt.NDArray[Any]:
        """``numpy.asarray(variable)`` support (a copy); ``ShapeError`` for more than 32 axes."""
    def item(self) -> float:
        """The value of a one-element variable; ``ShapeError`` otherwise."""
    def __float__(self) -> float:
        """``float(v)``: as ``item()``."""
    def __int__(self) -> int:
        """``int(v)``: ``int(v.item())`` (truncated; ``ValueError`` for NaN, ``OverflowError``
        for an infinity); ``ShapeError`` for more than one element."""
    def __format__(self, spec: str, /) -> str:
        """An empty spec gives ``str(v)``; with a spec a one-element variable formats as its
        float value (``f"{loss:.3f}"``) and more elements are a ``TypeError``."""
    @property
    def grad(self) -> npt.NDArray[np.float32] | None:
        """The committed gradient (float32 copy of shape ``self.shape``) or ``None``;
        ``ShapeError`` for more than 32 axes."""
    @grad.setter
    def grad(self, value: npt.ArrayLike | None) -> None:
        """Replaces the committed gradient of a trainable leaf (PyTorch's ``p.grad = g``; a
        float32 copy on the leaf's device); ``None`` clears it. ``ShapeError`` for another
        shape, ``ConfigError`` for an op result or a leaf that does not require grad,
        ``CheckpointError`` inside a checkpoint's replay."""
    def copy_(self, array: npt.ArrayLike) -> None:
        """Overwrites a leaf's value in place (PyTorch's ``with torch.no_grad(): p.copy_(src)``);
        graphs that read the old value become stale. ``ShapeError`` for another shape,
        ``ConfigError`` for an op result."""
    @property
    def requires_grad(self) -> bool:
        """Whether gradients flow to this node."""
    @property
    def is_leaf(self) -> bool:
        """Whether this node was created from data rather than by an op."""
    @property
    def name(self) -> str | None:
        """The name used in messages."""
    @property
    def op(self) -> str:
        """The op that produced this node (``"leaf"`` for leaves)."""
    def backward(
        self,
        *,
        retain_graph: bool | None = None,
        gradient_hook: Callable[[Variable, npt.NDArray[np.float32]], npt.ArrayLike | None]
        | None = None,
    ) -> None:
        """Backpropagates from this one-element output, replacing the gradients of the trainable
        leaves reached (GIL released). ``retain_graph=False`` frees each node's saved values as
        soon as its VJP ran (lower peak; differentiating the graph again is then a
        ``RiftcoError``); ``None`` (the default) or ``True`` keeps the graph. Raises ``ShapeError`` (not one element), ``StaleGraphError``,
        ``CheckpointError`` (also when called by a checkpoint callable during its replay), or
        the exception of a Python checkpoint callable, unchanged; on error no gradient
        changes. ``gradient_hook(leaf, grad)``, when given, receives each trainable leaf's
        whole gradient (float32 array) as soon as the pass has summed it; it returns ``None``
        (the gradient is not committed) or an array of the leaf's shape to commit."""
    def backward_accumulate(self, *, retain_graph: bool | None = None) -> None:
        """Like ``backward()`` but adds to the committed gradients (micro-batch accumulation)."""
    def zero_grad(self) -> None:
        """Clears this node's committed gradient, releasing its buffer."""
    def detach(self) -> Variable:
        """A new leaf sharing this value, detached from the graph."""
    @property
    def storage_encoding(self) -> str | None:
        """How the value is stored (``"float32"``, ``"bfloat16"``, ``"float16"``, ``"nf4"``,
        ``"q4_k"``, ...); ``None`` while released. ``DeviceMismatchError`` on a GPU."""
    @property
    def is_released(self) -> bool:
        """Whether the elements were released (``release_storage``) and not restored."""
    def encoded_bytes(
        self, start: int | None = None, stop: int | None = None
    ) -> npt.NDArray[np.uint8]:
        """The elements as stored, little-endian (uint8, 1-D; a bitwise copy), or bytes
        ``start:stop`` of them (clipped; only those are copied)."""
    @property
    def encoded_nbytes(self) -> int:
        """How many bytes ``encoded_bytes()`` gives, without copying them."""
    def release_storage(self) -> None:
        """Frees the elements (shape and version kept) for every handle sharing them."""
    def restore_storage(self, encoding: str, data: bytes | npt.NDArray[np.uint8]) -> None:
        """Puts ``encoding`` bytes back into a released value without bumping its version;
        ``ValueError`` for an unknown encoding, ``RiftcoError`` for a value not released or a
        wrong size (both named)."""
    def bump_version(self) -> None:
        """Marks the value changed (graphs recorded before become stale)."""
    def graph_statistics(self) -> dict[str, int]:
        """``{"node_count": reachable nodes, "element_count": float32 elements they own}``."""
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Variable]:
        """``self[0], self[1], ...`` (lazily); ``TypeError`` for a 0-d Variable."""
    # Operators: NumPy broadcasting; a Python int/float or a numeric NumPy array (a float32
    # constant on this Variable's device) on either side (comparisons too, typed without arrays
    # here to keep the reflected signatures of ndarray and Variable apart). ``==`` and friends
    # return 1.0/0.0 Variables that never require grad; hashing stays identity-based.
    def __add__(self, other: _Operand, /) -> Variable: ...
    def __radd__(self, other: _Operand, /) -> Variable: ...
    def __sub__(self, other: _Operand, /) -> Variable: ...
    def __rsub__(self, other: _Operand, /) -> Variable: ...
    def __mul__(self, other: _Operand, /) -> Variable: ...
    def __rmul__(self, other: _Operand, /) -> Variable: ...
    def __truediv__(self, other: _Operand, /) -> Variable: ...
    def __rtruediv__(self, other: _Operand, /) -> Variable: ...
    def __matmul__(self, other: Variable, /) -> Variable:
        """2-D @ 2-D, N-D @ 2-D, or N-D @ N-D with equal leading axes (N >= 3)."""
    def __rmatmul__(self, other: Variable, /) -> Variable:
        """``other @ self`` (Python calls it only for a non-Variable ``other``: then
        ``NotImplemented``, so ``2 @ x`` raises ``TypeError``)."""
    def __rpow__(self, other: object, mod: None = None, /) -> NotImplementedType:
        """``NotImplemented`` for a number (``2 ** x`` raises ``TypeError``); ``TypeError`` for a
        Variable ``other`` (Variable exponents are not supported)."""
    def __neg__(self) -> Variable: ...
    def __pow__(self, exponent: float, modulo: None = None, /) -> Variable:
        """A finite Python number exponent (``TypeError`` for a Variable exponent)."""
    def __lt__(self, other: Variable | float, /) -> Variable: ...
    def __le__(self, other: Variable | float, /) -> Variable: ...
    def __gt__(self, other: Variable | float, /) -> Variable: ...
    def __ge__(self, other: Variable | float, /) -> Variable: ...
    def __eq__(self, other: object, /) -> Variable:  # type: ignore[override]
        ...
    def __ne__(self, other: object, /) -> Variable:  # type: ignore[override]
        ...
    def __hash__(self) -> int: ...
    __array_ufunc__: None
    def __bool__(self) -> bool:
        """Nonzero for a one-element Variable; ``ValueError`` for any other size."""
    def sum(
        self, axis: SupportsIndex | Sequence[SupportsIndex] | None = None, keepdims: bool = False
    ) -> Variable:
        """``functional.sum(self, axis, keepdims)``."""
    def mean(
        self, axis: SupportsIndex | Sequence[SupportsIndex] | None = None, keepdims: bool = False
    ) -> Variable:
        """``functional.mean(self, axis, keepdims)``."""
    def exp(self) -> Variable: ...
    def log(self) -> Variable: ...
    def tanh(self) -> Variable: ...
    def sigmoid(self) -> Variable: ...
    def relu(self) -> Variable: ...

def tensor(
    array: npt.ArrayLike | Variable, requires_grad: bool = False, name: str | None = None
) -> Variable:
    """A leaf ``Variable`` from an array-like (alias of the ``Variable`` constructor)."""

def checkpoint(
    fn: Callable[..., Variable],
    x: Variable | tuple[Variable, ...] | list[Variable],
    dependencies: Sequence[Variable] = ...,
    *,
    save: list[str] | tuple[str, ...] | None = None,
    preserve_rng_state: bool = True,
    determinism_check: str = "metadata",
    name: str | None = None,
    prune_unused_dependencies: bool = False,
) -> Variable:
    """Activation checkpointing (Chen et al. 2016): ``fn(x)`` now, keeping only its output value,
    and once more during backward. ``dependencies`` lists every pre-existing leaf ``fn`` reads.

    ``x`` may be a tuple or list of Variables: ``fn(*x)`` is called, each input gets its own
    gradient, and the output must depend on every input; an empty tuple, the same Variable
    twice (or as an input and a dependency) raise ``CheckpointError``; anything else than a
    Variable or a tuple/list of Variables raises ``TypeError`` naming it.

    ``preserve_rng_state`` (default ``True``): the replay starts from the generator state the
    first run started from (same draws) and the thread's state is restored afterwards.
    ``determinism_check``: ``"off"`` (output shape only), ``"metadata"`` (default: shape,
    device and the replay's graph — its op names and shapes, so a module switched between
    ``train()`` and ``eval()`` before ``backward()`` raises ``CheckpointError``; PyTorch's
    level) or ``"values"`` (also a hash of the output values and the
    generator counter; a mismatch raises ``CheckpointError`` from ``backward()`` naming the
    checkpoint, ``name`` or ``fn.__qualname__``, and the first differing element with both
    values, committing nothing). An unknown spelling raises ``ConfigError`` naming it.

    ``save`` lists names of ``named`` values inside ``fn`` to keep from the first run: the
    replay reuses them instead of calling their functions again (gradients unchanged, bit for
    bit). A name no ``named`` call used raises ``CheckpointError`` listing the names used.

    An exception raised by ``fn`` (now or at replay) propagates unchanged and leaves every
    public gradient untouched; at replay it gains a note (PEP 678) naming the checkpoint
    (``name`` or the callable's ``__qualname__``). Contract violations raise ``CheckpointError``. During its replay
    ``fn`` must not call ``backward()`` (``CheckpointError``, nothing committed) nor change a value
    the graph read, e.g. an optimizer ``step()`` (``StaleGraphError`` from the outer
    ``backward()``, nothing committed).
    """

def named(name: str, fn: Callable[..., Variable], *inputs: Variable) -> Variable:
    """``fn(*inputs)`` as the value ``name``: inside a ``checkpoint`` whose ``save`` lists
    ``name`` the first run keeps it and the replay returns it without calling ``fn``; elsewhere
    just ``fn(*inputs)``. ``fn`` may read only ``inputs`` and leaves (``CheckpointError``
    otherwise, and when the replay calls saved names in another order or with other input
    shapes); ``TypeError`` for a non-Variable input or result; ``fn``'s exceptions propagate."""

def manual_seed(seed: int) -> None:
    """Seeds the calling thread's generator: the state becomes ``(seed, 0)``. The state is per
    thread (a new thread starts at ``(0, 0)``). ``ConfigError`` for anything but an int in
    ``[0, 2**64)`` (a bool included)."""

def get_rng_state() -> tuple[int, int]:
    """The calling thread's generator state ``(seed, offset)``: the seed and how many generator
    blocks were drawn since it was set."""

def set_rng_state(state: tuple[int, int]) -> None:
    """Sets the calling thread's generator state (``(seed, offset)``, ints in ``[0, 2**64)``);
    ``ConfigError`` for anything else."""

def uniform(
    shape: Sequence[int], low: float = 0.0, high: float = 1.0, requires_grad: bool = False
) -> Variable:
    """A new leaf of ``shape`` uniform in ``[low, high)`` (float32 rounding may give ``high``)
    drawn from the calling thread's generator (one block per call). ``ConfigError`` for a
    non-finite bound or ``low >= high``."""

def normal(
    shape: Sequence[int], mean: float = 0.0, std: float = 1.0, requires_grad: bool = False
) -> Variable:
    """A new leaf of ``shape`` normal with ``mean`` and ``std`` drawn from the calling thread's
    generator (one block per call). ``ConfigError`` for a non-finite value or ``std < 0``."""

def is_grad_enabled() -> bool:
    """Whether ops on the calling thread record a graph (``False`` inside ``no_grad``)."""

def _set_grad_enabled(enabled: bool) -> bool:
    """Sets the calling thread's recording switch; returns the previous setting."""

def _node_id(v: Variable) -> int:
    """The graph node's identity (equal for two wrappers of one node)."""


# ---------------------------------------------------------------------------------------------
# The transformer
# ---------------------------------------------------------------------------------------------

@final
class TransformerConfig:
    """Sizes and numerics of a LLaMA-style decoder-only transformer (immutable, validated on
    construction: ``ConfigError`` names the first invalid field)."""

    def __new__(
        cls,
        vocab_size: int,
        d_model: int,
        n_heads: int,
        n_layers: int,
        d_ff: int,
        max_seq_len: int,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        seed: int = 0,
        attention_dropout: float | None = None,
        residual_dropout: float | None = None,
        rope_scaling: Any = None,
        bos_token_id: int | None = None,
        eos_token_ids: int | Sequence[int] | None = None,
        n_kv_heads: int | None = None,
        tie_word_embeddings: bool | None = None,
    ) -> TransformerConfig:
        """``attention_dropout`` / ``residual_dropout``: probabilities in ``[0, 1)`` (``None``
        means 0); a bool, a non-number or a value outside ``[0, 1)`` raises ``ConfigError``
        naming the field. ``rope_scaling``: ``{"rope_type": "default"}`` (``None``),
        ``{"rope_type": "linear", "factor": f}`` or ``{"rope_type": "llama3", "factor",
        "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}``; token ids
        must be below ``vocab_size``. ``n_kv_heads``: key/value heads of grouped-query
        attention, an int >= 1 dividing ``n_heads`` (``None`` means ``n_heads``);
        ``tie_word_embeddings``: a bool, the LM head reads the embedding matrix (``None`` means
        False)."""
    @staticmethod
    def from_dict(d: dict[str, Any]) -> TransformerConfig:
        """A config from the constructor's keyword names (e.g. ``to_dict()`` output)."""
    @property
    def vocab_size(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def d_ff(self) -> int: ...
    @property
    def max_seq_len(self) -> int: ...
    @property
    def rms_norm_eps(self) -> float: ...
    @property
    def rope_theta(self) -> float: ...
    @property
    def seed(self) -> int: ...
    @property
    def attention_dropout(self) -> float: ...
    @property
    def residual_dropout(self) -> float: ...
    @property
    def rope_scaling(self) -> dict[str, Any]:
        """RoPE frequency scaling (``{"rope_type": ..., ...}``)."""
    @property
    def bos_token_id(self) -> int | None: ...
    @property
    def eos_token_ids(self) -> list[int]: ...
    @property
    def d_head(self) -> int:
        """``d_model // n_heads``."""
    @property
    def n_kv_heads(self) -> int:
        """Key/value heads (``n_heads`` for multi-head attention)."""
    @property
    def tie_word_embeddings(self) -> bool:
        """Whether the LM head reads the token embedding matrix."""
    def to_dict(self) -> dict[str, Any]:
        """The constructor arguments as a JSON-serialisable dict."""
    def __eq__(self, value: object, /) -> bool: ...
    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]: ...

@final
class DecodeSession:
    """Incremental decoding with a per-layer K/V cache (no graph; GIL released per token)."""

    def decode_token(self, token: int) -> npt.NDArray[np.float32]:
        """Feeds ``token`` and returns the next-token logits, float32 ``[vocab_size]``.
        Raises ``TokenError`` (id outside the vocabulary) or ``DecodeError`` (cache full, or the
        model changed structurally after the session was opened: ``enable_lora``,
        ``set_lora_active``, ``merge_lora``, ``load_lora``; open a new session)."""
    def decode_tokens(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Feeds ``tokens`` at the next positions and returns the next-token logits after the
        last, float32 ``[vocab_size]``. Into an empty session (a prompt) they run as one
        sequence (about one forward of ``T`` tokens); into one holding positions, one at a time.
        ``TokenError`` for an id outside the vocabulary or no tokens (nothing fed);
        ``DecodeError`` as :meth:`decode_token`."""
    @property
    def position(self) -> int:
        """Tokens decoded so far."""
    def reset(self) -> None:
        """Empties the cache."""

_TokenArray = npt.ArrayLike

class _ParameterOwner(Protocol):
    """What ``DecoderOnlyTransformer.set_parameter_residency`` takes."""

    def acquire(self, unit: str, reason: str, next: str | None) -> None: ...
    def release(self, unit: str) -> None: ...

@final
class DecoderOnlyTransformer:
    """A LLaMA-style decoder-only transformer.

    ``attention``: one of ``ATTENTION_KINDS``. ``activation_checkpointing``: a policy spelling
    (``"disabled"``, ``"block"``, ``"segments:K"``, ``"auto"``, ``"selective[:NAME]"``, a
    comma-separated per-block list, ``"budget:SIZE"``) or a list/tuple of per-block strings, one
    per layer (``None``: ``"disabled"``). ``activation_memory_budget``: bytes or a size string
    (``"64MiB"``), the budget planner's policy (only with ``"disabled"``). Bad values raise
    ``ConfigError`` naming the value and what is accepted.
    """

    def __new__(
        cls,
        config: TransformerConfig,
        attention: str = "flash",
        activation_checkpointing: _Policy | None = "disabled",
        activation_memory_budget: _Budget | None = None,
        *,
        determinism_check: str = "metadata",
    ) -> DecoderOnlyTransformer: ...
    def to(self, device: str) -> DecoderOnlyTransformer:
        """Moves every parameter and gradient to ``device`` in place and returns the model:
        ``"cpu"``, ``"vulkan"``, ``"metal"``, ``"gpu"`` (the best adapter; a GPU is opened on
        first use) or ``"privateuseone"``. ``DeviceUnavailableError`` when the GPU asked for has
        no adapter (naming what was looked for and what was found; ``"metal"`` off macOS) or no
        backend is registered; other names raise ``ConfigError``. Build optimizers after."""
    @property
    def device(self) -> str:
        """The resolved device: ``"cpu"``, ``"vulkan"``, ``"metal"`` or ``"privateuseone"``."""
    @property
    def activation_checkpointing(self) -> str:
        """The policy's canonical spelling (``"selective"`` reads back as
        ``"selective:attention_ffn"``, a list as its comma-separated form, a budget as
        ``"budget:BYTES"``)."""
    @property
    def loss_chunk_bytes(self) -> int | None:
        """How ``loss()`` computes the LM head and cross-entropy: the byte budget of the chunked
        loss's logits workspace (default 64 MiB: ``budget // (4 * (vocab_size + 1))`` tokens a
        chunk, at least one; gradients computed in the same pass, so the ``[tokens, vocab]``
        logits and their gradient are never whole), or ``None`` for whole logits. Same loss
        and gradients within f32 rounding; ``logits()`` is always whole. Set
        an int, a size string (``"64MiB"``) or ``None``; ``0``, negative, fractional, float or
        bool sizes raise ``ConfigError`` naming ``loss_chunk_bytes``. Not model state."""
    @loss_chunk_bytes.setter
    def loss_chunk_bytes(self, bytes: int | str | None) -> None: ...
    @property
    def determinism_check(self) -> str:
        """What every checkpoint of the policy compares at replay: ``"off"``, ``"metadata"``
        (default) or ``"values"`` (a mismatch raises ``CheckpointError`` naming the block,
        ``block N (model.layers.N)``). Not model state; an unknown spelling raises
        ``ConfigError``."""
    @determinism_check.setter
    def determinism_check(self, check: str) -> None: ...
    def set_activation_checkpointing(
        self, policy: _Policy | None = None, *, activation_memory_budget: _Budget | None = None
    ) -> None:
        """Changes the policy of later training forwards (the constructor's forms; ``None``:
        ``"disabled"``). ``ConfigError`` naming the value, the policy unchanged then."""
    def activation_checkpointing_plan(self, batch: int, seq: int) -> dict[str, Any]:
        """The per-block plan for training inputs ``[batch, seq]`` (GIL released; ``auto`` and
        budgets measure this model at that shape the first time): ``policy``, ``summary``,
        ``per_block``, ``segments`` (``{"layers": [start, stop], "policy"}``),
        ``segment_length``, ``predicted_peak_bytes``, ``predicted_step_seconds`` and
        ``measurement`` (``None``, or bytes and seconds per candidate policy, ``boundary_bytes``
        ``M_ckpt``, ``layer_bytes`` ``M_layer``, ``optimal_segment_length`` ``k*``). Planning
        does not reset the peak counters of ``memory_stats()``: its probe allocations (one block
        at a time) count in the process-wide peak like any allocation. ``ConfigError`` for a
        budget below the smallest achievable peak (named), ``batch``/``seq`` out of range or not
        an int (a bool is not one), or a shape whose largest activation (``batch * seq *
        max(d_model, d_ff, vocab_size)`` float32) exceeds 2**47 bytes."""
    @property
    def attention(self) -> str: ...
    def set_attention(self, kind: str) -> None: ...
    def set_parameter_residency(self, owner: _ParameterOwner | None) -> None:
        """Sets the owner of the parameters between uses (``acquire(unit, reason, next)``
        before the model reads a unit, ``release(unit)`` after); ``None`` removes it.
        ``TypeError`` when a method is missing."""
    @property
    def has_parameter_residency(self) -> bool:
        """Whether an owner of the parameters is set."""
    @property
    def config(self) -> TransformerConfig: ...
    def parameters(self) -> list[Variable]:
        """Trainable leaves: every base parameter, or the LoRA ``A``/``B`` while adapters exist."""
    def named_parameters(self) -> list[tuple[str, Variable]]:
        """Base parameters with Hugging Face Llama names, in state-dict order."""
    def named_lora_parameters(self) -> list[tuple[str, Variable]]:
        """LoRA parameters with PEFT names (empty without adapters)."""
    def loss(
        self,
        tokens: _TokenArray,
        labels: _TokenArray | None = None,
        position_ids: _TokenArray | None = None,
    ) -> Variable:
        """Mean next-token cross-entropy of an integer block ``[batch, seq + 1]`` (a scalar).
        ``labels`` (same shape; Hugging Face's convention, shifted inside the loss) gives the
        targets, ``-100`` (``IGNORE_INDEX``) marking positions that are not targets: the mean
        is over the others, and ignored ones contribute no gradient. Raises ``TokenError`` for
        bad ids (named), layouts, ``seq > max_seq_len``, bad labels, or labels that ignore
        every target. ``position_ids`` (same shape, counting ``0, 1, ..`` per example and
        restarting at 0; Hugging Face's padding-free convention) packs several examples per
        row, each computed as if alone; a bad value is a ``TokenError`` naming it."""
    def logits(self, tokens: _TokenArray, position_ids: _TokenArray | None = None) -> Variable:
        """Logits ``[batch * seq, vocab_size]`` of integer tokens ``[batch, seq]``
        (``position_ids`` packs examples per row, as in ``loss``)."""
    def enable_lora(
        self,
        rank: int = 8,
        alpha: float = 16.0,
        mlp: bool = False,
        seed: int = 0,
        attention: bool = True,
        dropout: float | None = None,
    ) -> None:
        """Adds and activates LoRA adapters; freezes the base. ``LoraError`` on misuse;
        ``ConfigError`` naming ``lora_dropout`` for a ``dropout`` outside ``[0, 1)``."""
    def set_lora_active(self, active: bool) -> None: ...
    def set_frozen_weights_dtype(self, dtype: str) -> None:
        """Stores every frozen base weight in ``"bfloat16"`` / ``"float16"``, a quantized format
        (``"nf4"``, ``"q8_0"``, ``"q4_0"``, ``"q4_1"``, ``"q5_0"``, ``"q5_1"``, ``"q2_k"`` ...
        ``"q6_k"``: every matrix; the norms stay float32), or back in ``"float32"``, while ops
        compute in float32 (a 16-bit weight is upcast in a transient copy, a quantized one
        dequantized a block at a time, counted as workspace); results bitwise those of float32
        weights holding the same values (quantized: for weights of up to 4 MiB in f32).
        ``ConfigError`` naming ``dtype`` for another name, with no frozen weight (enable LoRA
        first), a 16-bit dtype off the CPU, or a matrix whose rows are not whole blocks."""
    @property
    def frozen_weights_dtype(self) -> str:
        """``"float32"``, ``"bfloat16"``, ``"float16"`` or a quantized format (``"nf4"``,
        ``"q4_1"``, ...; the one holding the most weights): how the frozen weights are stored."""
    def merge_lora(self) -> None: ...
    @property
    def has_lora(self) -> bool: ...
    @property
    def lora_active(self) -> bool: ...
    def save(self, path: str | os.PathLike[str], dtype: str = "float32") -> None:
        """Safetensors model state (HF Llama names) plus ``config.json`` beside it; the folder
        is replaced atomically as a whole (built beside it, other files hard-linked, exchanged in
        one system call), so every reader sees the old or the new model whole;
        ``dtype="bfloat16"`` rounds to nearest even."""
    @property
    def bos_token_id(self) -> int | None: ...
    @property
    def eos_token_ids(self) -> list[int]: ...
    @staticmethod
    def load(
        path: str | os.PathLike[str],
        attention: str = "flash",
        activation_checkpointing: _Policy | None = "disabled",
        activation_memory_budget: _Budget | None = None,
        *,
        determinism_check: str = "metadata",
        dtype: str | None = None,
    ) -> DecoderOnlyTransformer:
        """A model from a file written by ``save()``, a Hugging Face safetensors checkpoint or a
        ``llama`` GGUF file (its quantized blocks kept as stored, the base frozen, unless
        ``dtype="float32"``); ``ModelStateError`` / ``OSError``; ``determinism_check`` as for
        the constructor (not saved); ``dtype="bfloat16"`` / ``"float16"`` reads the base
        straight into frozen 16-bit storage, ``"nf4"``, ``"q8_0"``, ``"q4_k"``, ... quantizes
        every base matrix."""
    def load_weights(self, path: str | os.PathLike[str]) -> None: ...
    def save_lora(self, dir: str | os.PathLike[str]) -> None:
        """PEFT ``adapter_model.safetensors`` + ``adapter_config.json`` into ``dir``, which is
        replaced atomically as a whole, as by ``save``."""
    def load_lora(self, dir: str | os.PathLike[str]) -> None: ...
    def decode_session(self) -> DecodeSession:
        """A K/V-cache session over the current weights; it follows their values, and raises
        ``DecodeError`` after a structural change (LoRA enabled, toggled, merged or loaded)."""
    @property
    def block_forward_count(self) -> int:
        """Block forwards so far (original forwards plus checkpoint replays)."""
    def train(self, mode: bool = True) -> DecoderOnlyTransformer:
        """Training mode (the default; dropout active while a graph is recorded); returns the
        model."""
    def eval(self) -> DecoderOnlyTransformer:
        """Evaluation mode (never drops); returns the model."""
    @property
    def training(self) -> bool: ...
    @property
    def dropout_step(self) -> int:
        """Training forwards that dropped so far (the mask stream position; not saved). Set it
        to an int in ``[0, 2**64)``; anything else (a bool too) raises ``ConfigError``."""
    @dropout_step.setter
    def dropout_step(self, step: int) -> None: ...
    @property
    def lora_dropout(self) -> float:
        """Dropout probability on the active adapters' inputs (0 without them)."""
    def set_dropout(
        self,
        attention_dropout: float | None = None,
        residual_dropout: float | None = None,
        lora_dropout: float | None = None,
    ) -> None:
        """Changes the given probabilities (``None`` keeps one); ``ConfigError`` naming the
        field, ``LoraError`` for ``lora_dropout`` without adapters."""

# ---------------------------------------------------------------------------------------------
# Optimizers
# ---------------------------------------------------------------------------------------------

@final
class Adam:
    """Adam with bias correction and PyTorch's defaults (L2 ``weight_decay``).

    ``params`` must be distinct leaves, at least one trainable (else ``ConfigError``); frozen
    leaves are never updated. Step counts are per parameter; a ``step()`` with no gradient at all
    changes nothing and is not counted in ``steps``.
    """

    def __new__(
        cls,
        params: Iterable[Variable],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> Adam: ...
    def step(self) -> None: ...
    def zero_grad(self) -> None: ...
    @property
    def lr(self) -> float: ...
    @lr.setter
    def lr(self, value: float) -> None: ...
    @property
    def steps(self) -> int: ...
    def parameters(self) -> list[Variable]: ...
    def state_dict(self) -> dict[str, Any]:
        """PyTorch's shape: ``{"state": {index: {"step", "exp_avg", "exp_avg_sq"}},
        "param_groups": [{"lr", "betas", "eps", "weight_decay", "decoupled_weight_decay",
        "params", "param_names", "steps"}]}`` (copies; frozen parameters have no entry)."""
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a ``state_dict()``, checked whole first; ``ConfigError`` names the first
        mismatch and nothing changes."""
    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the state to the safetensors file ``path`` atomically: ``{name}.exp_avg`` and
        ``{name}.exp_avg_sq`` (float32) per trainable parameter, named as in the model, and the
        hyper-parameters and step counts in the header's ``riftco_optimizer`` metadata.
        ``OSError`` when the folder is missing or not writable."""
    def load(self, path: str | os.PathLike[str]) -> None:
        """Loads a ``save()`` file, checked whole first (nothing changes on error):
        ``ModelStateError`` for a file that is not such a state, ``ConfigError`` naming the
        first mismatch for a state of other parameters, ``OSError`` when unreadable."""

@final
class AdamW:
    """AdamW: Adam with decoupled weight decay (default 0.01), PyTorch's defaults. Parameters,
    frozen leaves and step counts as for ``Adam``."""

    def __new__(
        cls,
        params: Iterable[Variable],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> AdamW: ...
    def step(self) -> None: ...
    def zero_grad(self) -> None: ...
    @property
    def lr(self) -> float: ...
    @lr.setter
    def lr(self, value: float) -> None: ...
    @property
    def steps(self) -> int: ...
    def parameters(self) -> list[Variable]: ...
    def state_dict(self) -> dict[str, Any]:
        """PyTorch's shape: ``{"state": {index: {"step", "exp_avg", "exp_avg_sq"}},
        "param_groups": [{"lr", "betas", "eps", "weight_decay", "decoupled_weight_decay",
        "params", "param_names", "steps"}]}`` (copies; frozen parameters have no entry)."""
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a ``state_dict()``, checked whole first; ``ConfigError`` names the first
        mismatch and nothing changes."""
    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the state to the safetensors file ``path`` atomically: ``{name}.exp_avg`` and
        ``{name}.exp_avg_sq`` (float32) per trainable parameter, named as in the model, and the
        hyper-parameters and step counts in the header's ``riftco_optimizer`` metadata.
        ``OSError`` when the folder is missing or not writable."""
    def load(self, path: str | os.PathLike[str]) -> None:
        """Loads a ``save()`` file, checked whole first (nothing changes on error):
        ``ModelStateError`` for a file that is not such a state, ``ConfigError`` naming the
        first mismatch for a state of other parameters, ``OSError`` when unreadable."""

def write_file_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically, as the model files are written: a fresh temporary
    ``.{name}.tmp.{pid}.{n}`` in the same folder (mode ``0644``), fsync, rename over ``path``,
    fsync of the folder; temporaries of ``path`` left by killed processes are removed first.
    Raises ``OSError`` when the folder is missing or not writable (``path`` intact) and
    ``ModelStateError`` when ``path`` has no file name or is a FIFO, device or socket."""
