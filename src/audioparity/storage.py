"""How ggml stores a weight and how its CPU backend rounds a matmul's input, as float32 values.

Both sides use it: the ggml ports pick each weight's storage type with
:func:`storage_or_fallback`, and a quantization-aware reference (:func:`emulating`) computes in
torch with the weights as ggml stores them (:func:`stored`) and every matmul input rounded as
ggml's CPU backend rounds it (:func:`matmul_input`). It imports neither ggml nor (until
:func:`emulating` runs) torch. Sources: ggml ``ggml-quants.c`` (``quantize_row_q8_0_ref``, what
``ggml_quantize_chunk`` stores), ``ggml-impl.h`` (``ggml_compute_fp32_to_bf16``), and
``ggml-cpu`` (``type_traits_cpu[...].vec_dot_type`` and ``from_float``: ``quantize_row_q8_0``
of ``arch/x86/quants.c``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.errors import AudioparityError
from audioparity.vocabulary import STORAGE_TYPES

#: Values per block of each storage type (ggml ``ggml_blck_size``): a block type's rows (the
#: last numpy axis, ggml ``ne[0]``) are a multiple of it.
BLOCK_SIZES = {"f32": 1, "f16": 1, "bf16": 1, "q8_0": 32}

#: Storage a weight falls back to when the block type asked for cannot hold its rows.
FALLBACK_STORAGE = "f16"

#: Weight types whose ggml cells are compared with a quantization-aware reference: what ggml
#: computes at f32 is what torch computes, so f32 (and native) cells need none.
EMULATED_TYPES = ("f16", "bf16", "q8_0")


def storage_supported(storage: str, shape: tuple[int, ...]) -> bool:
    """Whether an array of numpy ``shape`` can be stored as ``storage``.

    Raises:
        AudioparityError: an unknown storage type.
    """
    if storage not in STORAGE_TYPES:
        raise AudioparityError(
            f"unknown storage type {storage!r}; valid: {', '.join(STORAGE_TYPES)}"
        )
    return shape[-1] % BLOCK_SIZES[storage] == 0


def storage_or_fallback(name: str, wanted: str, shape: tuple[int, ...],
                        notes: list[str]) -> str:
    """``wanted`` when it can hold weight ``name`` of numpy ``shape`` (:func:`storage_supported`),
    else :data:`FALLBACK_STORAGE`, with a line saying so appended to ``notes`` (for the dump's
    manifest): q8_0 needs rows of a multiple of 32 values."""
    if storage_supported(wanted, shape):
        return wanted
    notes.append(f"{name} {list(shape)}: {wanted} needs rows of a multiple of its block size; "
                 f"stored as {FALLBACK_STORAGE}")
    return FALLBACK_STORAGE


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 -> float32 as ``ggml_compute_fp32_to_bf16``: round to nearest even, NaN
    made quiet."""
    u = x.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    bits = np.where(nan, (u >> 16) | 64, rounded).astype(np.uint32) << 16
    return bits.view(np.float32)


def _q8_0(x: np.ndarray, cpu: bool) -> np.ndarray:
    """float32 ``[..., K]`` (K a multiple of 32) -> q8_0 blocks -> float32.

    Weights (``cpu`` False, ``quantize_row_q8_0_ref``): ``d = amax / 127``, ``q = roundf(x / d)``
    (half away from zero, through ``id = 1 / d``). Matmul inputs (``cpu`` True, the x86
    ``quantize_row_q8_0``): ``id = 127 / amax``, ``q`` rounded half to even. Both store ``d``
    as f16; the value is ``q * d``.
    """
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK_SIZES["q8_0"])
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        if cpu:
            inverse = np.where(amax != 0, np.float32(127) / amax, np.float32(0))
        else:
            inverse = np.where(d != 0, np.float32(1) / d, np.float32(0))
    scaled = (blocks * inverse.astype(np.float32)).astype(np.float32)
    if cpu:
        q = np.rint(scaled)
    else:
        wide = scaled.astype(np.float64)
        q = np.sign(wide) * np.floor(np.abs(wide) + 0.5)
    with np.errstate(over="ignore"):
        scale = d.astype(np.float16).astype(np.float32)
    return (q.astype(np.float32) * scale).reshape(x.shape)


def stored(values: np.ndarray, storage: str) -> np.ndarray:
    """``values`` as ggml stores them as ``storage`` (``ggml_quantize_chunk``), read back as
    float32: f16 and bf16 rounded to nearest even, q8_0 in blocks of 32 along the last axis
    with an f16 scale each (:func:`_q8_0`).

    Raises:
        AudioparityError: an unknown storage type, or rows the block type cannot hold.
    """
    x = np.ascontiguousarray(values, dtype=np.float32)
    if not storage_supported(storage, x.shape):
        raise AudioparityError(f"{storage} cannot store rows of {x.shape[-1]} values (blocks of "
                               f"{BLOCK_SIZES[storage]})")
    if storage == "f16":
        with np.errstate(over="ignore"):  # beyond the f16 range: inf, as ggml stores it
            return x.astype(np.float16).astype(np.float32)
    if storage == "bf16":
        return _bf16(x)
    if storage == "q8_0":
        return _q8_0(x, cpu=False)
    return x.copy()


def matmul_input(values: np.ndarray, weight_storage: str) -> np.ndarray:
    """A matmul's input ``[..., K]`` as ggml's CPU backend rounds it before multiplying it with
    a weight stored as ``weight_storage``: converted to that type's ``vec_dot_type`` (f32 for
    f32, f16 for f16, bf16 for bf16, q8_0 for q8_0, the x86 rounding of :func:`_q8_0`), read
    back as float32. The products are then summed in float32.

    Raises:
        AudioparityError: an unknown storage type, or a q8_0 input whose K is no multiple of 32.
    """
    x = np.ascontiguousarray(values, dtype=np.float32)
    if weight_storage == "q8_0":
        if not storage_supported("q8_0", x.shape):
            raise AudioparityError(f"q8_0 matmul input of {x.shape[-1]} values per row")
        return _q8_0(x, cpu=True)
    return stored(x, weight_storage)


#: Rows of a weight rounded at a time by :func:`emulating`: the rounding's temporaries stay
#: small beside a 151936-row embedding (1.2 GB in float32 at the 1.7B shape).
_ROWS_AT_ONCE = 4096


@contextmanager
def emulating(model: Any, weight_type: str, keep: Collection[str] = ()) -> Iterator[list[str]]:
    """Within the block, the torch ``model`` computes as a ggml port on the CPU backend does with
    its matmul weights stored as ``weight_type`` (one of :data:`EMULATED_TYPES`); on leaving it,
    the model is float32 again (weights, hooks and forwards restored).

    The matmul weights are those of ``nn.Linear``, pointwise ``nn.Conv1d`` and ``nn.Conv2d``
    (kernel 1, one group; ggml runs them as matmuls over the channels), ``nn.Embedding`` (a
    lookup: rounded weights, the rows read as stored) and ``nn.LSTM`` (its input and recurrent
    matrices); each is stored as ``weight_type``, or as :data:`FALLBACK_STORAGE` where its rows
    are no multiple of the block size (:func:`storage_or_fallback`), and each matmul's input is
    rounded (:func:`matmul_input`) by a forward pre-hook, or for an LSTM by a step-by-step forward
    (torch's gate order ``i, f, g, o``). Other weights (norms, biases, conv kernels), and the
    modules named in ``keep`` (those a port keeps in float32), stay float32.
    A parameter shared by two modules (tied embeddings) is rounded once.

    Yields:
        One note per weight stored as the fallback (the ggml dump's manifest notes them alike).

    Raises:
        AudioparityError: ``weight_type`` is not emulated, or an LSTM with a projection.
    """
    if weight_type not in EMULATED_TYPES:
        raise AudioparityError(f"no quantization-aware reference for weight type "
                               f"{weight_type!r}; emulated: {', '.join(EMULATED_TYPES)}")
    emulation = _Emulation(weight_type)
    try:
        emulation.apply(model, keep)
        yield emulation.notes
    finally:
        emulation.restore()


class _Emulation:
    """What :func:`emulating` changed in a model, to restore it: the weights rounded (each
    parameter once, with its float32 copy), the input hooks, the LSTMs stepped."""

    def __init__(self, weight_type: str) -> None:
        self.weight_type = weight_type
        self.notes: list[str] = []
        self.originals: dict[int, tuple[Any, Any]] = {}
        self.hooks: list[Any] = []
        self.lstms: list[Any] = []

    def store(self, name: str, param) -> str:
        """Round parameter ``name`` in place as its storage type holds it; that type."""
        shape = tuple(param.shape[:2])  # a pointwise kernel [out, in, 1(, 1)] is a matrix
        storage = storage_or_fallback(name, self.weight_type, shape, self.notes)
        if id(param) not in self.originals:
            self.originals[id(param)] = (param, param.detach().clone())
            matrix = param.detach().numpy().reshape(shape)  # the parameter's own memory
            for first in range(0, shape[0], _ROWS_AT_ONCE):  # rows are stored independently
                rows = matrix[first:first + _ROWS_AT_ONCE]
                rows[...] = stored(rows, storage)
        return storage

    def round_input(self, module, storage: str, channels_last: bool) -> None:
        """Round ``module``'s input for a weight stored as ``storage`` (a pre-hook)."""
        self.hooks.append(module.register_forward_pre_hook(
            lambda _, args: (_rounded(args[0], storage, channels_last), *args[1:])))

    def apply(self, model: Any, keep: Collection[str]) -> None:
        """Every matmul weight of ``model`` (but the modules of ``keep``) stored, and its
        input rounded (:func:`emulating`).

        Raises:
            AudioparityError: an LSTM with a projection.
        """
        import torch

        for name, module in model.named_modules():
            if name in keep:
                continue
            if isinstance(module, torch.nn.Linear):
                self.round_input(module, self.store(f"{name}.weight", module.weight),
                                 channels_last=True)
            elif isinstance(module, torch.nn.Conv1d | torch.nn.Conv2d) and module.groups == 1 \
                    and set(module.kernel_size) == {1}:
                self.round_input(module, self.store(f"{name}.weight", module.weight),
                                 channels_last=False)
            elif isinstance(module, torch.nn.Embedding):
                self.store(f"{name}.weight", module.weight)
            elif isinstance(module, torch.nn.LSTM):
                if module.proj_size:
                    raise AudioparityError(f"{name}: an LSTM with proj_size={module.proj_size} "
                                           "is not emulated")
                types = {param: self.store(f"{name}.{param}", getattr(module, param))
                         for param, _ in module.named_parameters() if param.startswith("weight_")}
                module.forward = _LstmSteps(module, types)
                self.lstms.append(module)

    def restore(self) -> None:
        """The model float32 again: hooks removed, LSTMs' own forward, weights copied back."""
        import torch

        for hook in self.hooks:
            hook.remove()
        for module in self.lstms:
            del module.forward
        with torch.no_grad():
            for param, original in self.originals.values():
                param.copy_(original)


def _rounded(tensor, storage: str, channels_last: bool):
    """torch ``tensor`` through :func:`matmul_input`, along its last axis or (``channels_last``
    False, a conv input ``[N, C, T]`` or ``[N, C, H, W]``) along axis 1."""
    import torch

    array = tensor.detach().float().numpy()
    if not channels_last:
        array = np.moveaxis(array, 1, -1)
    out = matmul_input(array, storage)
    if not channels_last:
        out = np.moveaxis(out, -1, 1)
    return torch.from_numpy(np.ascontiguousarray(out)).to(tensor.dtype)


class _LstmSteps:
    """``nn.LSTM.forward`` one step at a time, each matmul's input (``x_t``, ``h_{t-1}``)
    rounded for its weight's storage: ``gates = W_ih x + b_ih + W_hh h + b_hh``, then
    ``c = sigmoid(f) c + sigmoid(i) tanh(g)``, ``h = sigmoid(o) tanh(c)`` (torch's equations)."""

    def __init__(self, lstm, types: dict[str, str]) -> None:
        self.lstm, self.types = lstm, types

    def __call__(self, input, hx=None):
        import torch

        lstm = self.lstm
        x = input.transpose(0, 1) if lstm.batch_first else input  # [T, N, in]
        n, hidden = x.shape[1], lstm.hidden_size
        if hx is None:
            zeros = x.new_zeros(lstm.num_layers, n, hidden)
            hx = (zeros, zeros)
        h_n, c_n = [], []
        for layer in range(lstm.num_layers):
            w_ih, w_hh = (getattr(lstm, f"{kind}_l{layer}") for kind in ("weight_ih", "weight_hh"))
            bias = (getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
                    if lstm.bias else 0)
            h, c, outputs = hx[0][layer], hx[1][layer], []
            for x_t in x:
                gates = (_rounded(x_t, self.types[f"weight_ih_l{layer}"], True) @ w_ih.T
                         + _rounded(h, self.types[f"weight_hh_l{layer}"], True) @ w_hh.T + bias)
                i, f, g, o = gates.chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outputs.append(h)
            x = torch.stack(outputs)
            h_n.append(h)
            c_n.append(c)
        output = x.transpose(0, 1) if lstm.batch_first else x
        return output, (torch.stack(h_n), torch.stack(c_n))


#: Joins a case's dump directory and an emulated weight type: ``clip@q8_0`` is the reference
#: dump of case ``clip`` computed as ggml does with q8_0 weights (no case name holds it).
EMULATED_SEPARATOR = "@"


def emulated_dir(output_dir: Path, weight_type: str | None) -> Path:
    """The dump directory of ``output_dir``'s case emulating ``weight_type`` (``None``: the
    float32 reference, ``output_dir`` itself)."""
    output_dir = Path(output_dir)
    if weight_type is None:
        return output_dir
    return output_dir.with_name(f"{output_dir.name}{EMULATED_SEPARATOR}{weight_type}")


@dataclass
class Emulation:
    """One model a reference job dumps with: the float32 model (``weight_type`` None) or the
    model computing as ggml's CPU backend does with its matmul weights in ``weight_type``."""

    weight_type: str | None
    model: Any
    notes: list[str]

    def dump_dir(self, output_dir: Path) -> Path:
        """Where this model dumps the case of ``output_dir`` (:func:`emulated_dir`)."""
        return emulated_dir(output_dir, self.weight_type)

    @property
    def fields(self) -> dict[str, Any]:
        """Manifest fields of its dumps: ``emulates`` (weight type, backend, fallback notes)."""
        if self.weight_type is None:
            return {}
        return {"emulates": {"weight_type": self.weight_type, "backend": "cpu",
                             "fallbacks": self.notes}}


def emulations(model: Any, weight_types: Sequence[str], keep: Collection[str] = ()
               ) -> Iterator[Emulation]:
    """The float32 ``model``, then the same model computing as ggml does with each of
    ``weight_types`` (:func:`emulating`, ``keep`` passed on), one at a time: each is float32
    again once the next is asked for (NeMo models cannot be deep-copied).

    Raises:
        AudioparityError: a weight type that is not emulated (before any model is yielded).
    """
    unknown = [t for t in weight_types if t not in EMULATED_TYPES]
    if unknown:
        raise AudioparityError(f"no quantization-aware reference for weight type(s) "
                               f"{', '.join(unknown)}; emulated: {', '.join(EMULATED_TYPES)}")
    yield Emulation(None, model, [])
    for weight_type in weight_types:
        with emulating(model, weight_type, keep) as notes:
            yield Emulation(weight_type, model, notes)
