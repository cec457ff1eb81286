"""Parakeet-TDT weights: read a ``.nemo`` or a Hugging Face Parakeet directory, name every tensor
as NeMo does, check shapes against the config, fold BatchNorm, and choose storage types.

Sources:

- ``.nemo``: a tar holding ``model_config.yaml`` and ``model_weights.ckpt``, a state dict written
  by ``torch.save`` (zip format), read without torch by :func:`read_torch_state_dict`: a pickle
  reader that accepts only what ``torch.save(state_dict)`` writes (the ``OrderedDict``,
  ``torch._utils._rebuild_tensor_v2``, storage classes) and maps each tensor onto its storage
  record of the zip with numpy; anything else is an error (NeMo itself is not needed either).
- Hugging Face directory: ``config.json`` + ``model.safetensors`` (or a sharded
  ``model.safetensors.index.json``), read by :mod:`audioparity.checkpoint` (memory-mapped, bf16
  widened exactly, no torch). Keys are mapped back to NeMo's
  by inverting transformers' ``convert_nemo_to_hf.py`` (``relative_k_proj`` -> ``linear_pos``,
  ``bias_u`` -> ``pos_bias_u``, ``q_proj`` -> ``linear_q``, ``encoder_projector`` -> ``joint.enc``,
  ...).

What :func:`load_weights` returns (canonical names, float32 arrays in the shapes the graphs use):

- every tensor of :func:`expected_shapes` as in the checkpoint, except
- 1x1 (pointwise) conv kernels squeezed to matrices ``[out, in]`` (they run as matmuls):
  ``encoder.pre_encode.conv.{3,6}.weight``, ``encoder.layers.{i}.conv.pointwise_conv{1,2}.weight``;
- the conv module's BatchNorm folded into its depthwise conv (eps from the config):
  ``depthwise_conv.weight`` ``[C, 1, 1, k]`` (a 2-D kernel of height 1) and
  ``depthwise_conv.bias`` ``[C]`` (always present); the ``batch_norm.*`` tensors are dropped.

Storage types (a property of each tensor; the graph code has no per-type branches):

- matmul weights (linear layers, pointwise convs, LSTM matrices, the prediction-net embedding,
  the joint): ``matmul_weight_type``; ``native`` means the checkpoint's own dtype;
- conv kernels (the 3x3 subsampling convs, the depthwise convs): ``conv_weight_type``;
- norms, biases, ``pos_bias_u/v``: always f32.

A block type that cannot hold a tensor (q8_0 needs rows of a multiple of 32 values) falls back to
f16 for that tensor, and :attr:`ParakeetWeights.notes` says so.
"""

from __future__ import annotations

import collections
import pickle
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from audioparity.checkpoint import DTYPES, check_finite, checkpoint_entries, to_float32
from audioparity.errors import AudioparityError
from audioparity.ggml import Runtime, Weights, storage_supported
from audioparity.models.parakeet_tdt.config import ParakeetTDTConfig, copy_nemo_member

MATMUL_WEIGHT_TYPES = ("native", "f32", "f16", "bf16", "q8_0")
CONV_WEIGHT_TYPES = ("f32", "f16")
#: Storage used when the requested block type cannot hold a tensor's rows.
FALLBACK_STORAGE = "f16"

#: Hugging Face Parakeet key -> NeMo key (inverse of transformers' convert_nemo_to_hf.py).
HF_TO_NEMO = (
    (r"^encoder\.subsampling\.layers\.", "encoder.pre_encode.conv."),
    (r"^encoder\.subsampling\.linear\.", "encoder.pre_encode.out."),
    (r"^encoder\.encode_positions\.", "encoder.pos_enc."),
    (r"^(encoder\.layers\.\d+\.conv)\.norm\.", r"\1.batch_norm."),
    (r"\.self_attn\.([qkv])_proj\.", r".self_attn.linear_\1."),
    (r"\.self_attn\.o_proj\.", ".self_attn.linear_out."),
    (r"\.self_attn\.relative_k_proj\.", ".self_attn.linear_pos."),
    (r"\.self_attn\.bias_([uv])$", r".self_attn.pos_bias_\1"),
    (r"^decoder\.embedding\.", "decoder.prediction.embed."),
    (r"^decoder\.lstm\.", "decoder.prediction.dec_rnn.lstm."),
    (r"^encoder_projector\.", "joint.enc."),
    (r"^decoder\.decoder_projector\.", "joint.pred."),
    (r"^joint\.head\.", "joint.joint_net.2."),
)

#: torch storage class (``torch.<name>``) -> (stored dtype, numpy dtype of its bytes).
_TORCH_STORAGES = {"FloatStorage": ("f32", "<f4"), "HalfStorage": ("f16", "<f2"),
                   "BFloat16Storage": ("bf16", "<u2")}
#: Storage classes whose tensors are read past (e.g. BatchNorm's int64 ``num_batches_tracked``).
_SKIPPED_TORCH_STORAGES = ("DoubleStorage", "LongStorage", "IntStorage", "ShortStorage",
                           "CharStorage", "ByteStorage", "BoolStorage")


@dataclass
class ParakeetWeights:
    """Host-side weights of a Parakeet-TDT checkpoint, ready to upload.

    Attributes:
        arrays: canonical (NeMo) name -> float32 array, in the shapes the graphs use (module doc).
        storage: name -> ``f32|f16|bf16|q8_0``.
        native: name -> the checkpoint's dtype (``f32|f16|bf16``).
        preprocessor: the checkpoint's frontend buffers (``preprocessor.featurizer.fb``
            ``[1, n_mels, n_fft/2+1]``, ``preprocessor.featurizer.window`` ``[win_length]``),
            when it has them (a ``.nemo`` does, a Hugging Face directory does not).
        notes: one line per storage fallback.
    """

    arrays: dict[str, np.ndarray]
    storage: dict[str, str]
    native: dict[str, str]
    preprocessor: dict[str, np.ndarray] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def upload(self, runtime: Runtime) -> Weights:
        """Upload every array once into ``runtime``'s backend, each in its storage type."""
        return runtime.upload(self.arrays, self.storage)


def expected_shapes(config: ParakeetTDTConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint (NeMo) name -> shape of every tensor the port reads, from the config.

    Mirrors the parameters of ``ConvSubsampling`` (dw_striding), ``ConformerLayer``,
    ``RNNTDecoder`` and ``RNNTJoint``. Linear/conv biases of the layers only when ``use_bias``.
    """
    enc, dec, joint = config.encoder, config.decoder, config.joint
    d, c, k = enc.d_model, enc.subsampling_conv_channels, enc.conv_kernel_size
    n_sub = int(np.log2(enc.subsampling_factor))
    freq = enc.feat_in
    for _ in range(n_sub):
        freq = (freq + 2 - 3) // 2 + 1
    shapes: dict[str, tuple[int, ...]] = {
        "encoder.pre_encode.conv.0.weight": (c, 1, 3, 3),
        "encoder.pre_encode.conv.0.bias": (c,),
        "encoder.pre_encode.out.weight": (d, c * freq),
        "encoder.pre_encode.out.bias": (d,),
    }
    for i in range(n_sub - 1):
        dw, pw = 2 + 3 * i, 3 + 3 * i
        shapes[f"encoder.pre_encode.conv.{dw}.weight"] = (c, 1, 3, 3)
        shapes[f"encoder.pre_encode.conv.{dw}.bias"] = (c,)
        shapes[f"encoder.pre_encode.conv.{pw}.weight"] = (c, c, 1, 1)
        shapes[f"encoder.pre_encode.conv.{pw}.bias"] = (c,)
    for i in range(enc.n_layers):
        p = f"encoder.layers.{i}."
        layer = {
            "feed_forward1.linear1.weight": (enc.d_ff, d),
            "feed_forward1.linear2.weight": (d, enc.d_ff),
            "self_attn.linear_q.weight": (d, d),
            "self_attn.linear_k.weight": (d, d),
            "self_attn.linear_v.weight": (d, d),
            "self_attn.linear_out.weight": (d, d),
            "self_attn.linear_pos.weight": (d, d),
            "self_attn.pos_bias_u": (enc.n_heads, enc.d_k),
            "self_attn.pos_bias_v": (enc.n_heads, enc.d_k),
            "conv.pointwise_conv1.weight": (2 * d, d, 1),
            "conv.depthwise_conv.weight": (d, 1, k),
            "conv.batch_norm.weight": (d,),
            "conv.batch_norm.bias": (d,),
            "conv.batch_norm.running_mean": (d,),
            "conv.batch_norm.running_var": (d,),
            "conv.pointwise_conv2.weight": (d, d, 1),
            "feed_forward2.linear1.weight": (enc.d_ff, d),
            "feed_forward2.linear2.weight": (d, enc.d_ff),
        }
        for norm in ("norm_feed_forward1", "norm_self_att", "norm_conv", "norm_feed_forward2",
                     "norm_out"):
            layer[f"{norm}.weight"] = (d,)
            layer[f"{norm}.bias"] = (d,)
        if enc.use_bias:
            for name in ("feed_forward1.linear1", "feed_forward2.linear1"):
                layer[f"{name}.bias"] = (enc.d_ff,)
            for name in ("feed_forward1.linear2", "feed_forward2.linear2", "self_attn.linear_q",
                         "self_attn.linear_k", "self_attn.linear_v", "self_attn.linear_out",
                         "conv.depthwise_conv", "conv.pointwise_conv2"):
                layer[f"{name}.bias"] = (d,)
            layer["conv.pointwise_conv1.bias"] = (2 * d,)
        shapes.update({p + name: shape for name, shape in layer.items()})
    h = dec.pred_hidden
    shapes["decoder.prediction.embed.weight"] = (dec.vocab_size + 1, h)
    for layer_index in range(dec.pred_rnn_layers):
        for kind in ("ih", "hh"):
            shapes[f"decoder.prediction.dec_rnn.lstm.weight_{kind}_l{layer_index}"] = (4 * h, h)
            shapes[f"decoder.prediction.dec_rnn.lstm.bias_{kind}_l{layer_index}"] = (4 * h,)
    shapes["joint.pred.weight"] = (joint.joint_hidden, joint.pred_hidden)
    shapes["joint.pred.bias"] = (joint.joint_hidden,)
    shapes["joint.enc.weight"] = (joint.joint_hidden, joint.encoder_hidden)
    shapes["joint.enc.bias"] = (joint.joint_hidden,)
    shapes["joint.joint_net.2.weight"] = (config.n_joint_outputs, joint.joint_hidden)
    shapes["joint.joint_net.2.bias"] = (config.n_joint_outputs,)
    return shapes


@dataclass(frozen=True)
class _StorageRef:
    """A storage of a torch zip checkpoint: record ``data/<key>`` holding ``numel`` values of
    class ``torch.<kind>``."""

    kind: str
    key: str
    numel: int


class _StateDictUnpickler(pickle.Unpickler):
    """Reads the ``data.pkl`` of a torch zip checkpoint holding a flat state dict.

    Allows only the globals ``torch.save(state_dict)`` writes (a subset of torch's
    ``_weights_only_unpickler`` allow-list): ``collections.OrderedDict``,
    ``torch._utils._rebuild_tensor_v2`` and the storage classes; storages are the persistent ids
    ``("storage", storage class, key, location, numel)`` (``torch.serialization._save``).
    Float tensors become ``(float32 array, stored dtype)``, others None.
    """

    def __init__(self, archive: zipfile.ZipFile, prefix: str, where: str) -> None:
        super().__init__(archive.open(f"{prefix}data.pkl"))
        self._archive, self._prefix, self._where = archive, prefix, where
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return self._rebuild_tensor_v2
        if module == "torch" and (name in _TORCH_STORAGES or name in _SKIPPED_TORCH_STORAGES):
            return name
        raise AudioparityError(f"{self._where}: unexpected {module}.{name} in data.pkl; only a "
                               "state dict of plain tensors is read")

    def persistent_load(self, pid):
        if (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], str) and isinstance(pid[4], int)):
            return _StorageRef(pid[1], str(pid[2]), pid[4])
        raise AudioparityError(f"{self._where}: unexpected persistent id {pid!r} in data.pkl")

    def _storage(self, ref: _StorageRef) -> np.ndarray:
        if ref.key not in self._storages:
            dtype = np.dtype(_TORCH_STORAGES[ref.kind][1])
            try:
                data = self._archive.read(f"{self._prefix}data/{ref.key}")
            except KeyError:
                raise AudioparityError(f"{self._where}: no record data/{ref.key}") from None
            if len(data) != ref.numel * dtype.itemsize:
                raise AudioparityError(
                    f"{self._where}: record data/{ref.key} holds {len(data)} bytes, expected "
                    f"{ref.numel} x {ref.kind} ({ref.numel * dtype.itemsize} bytes)")
            self._storages[ref.key] = np.frombuffer(data, dtype=dtype)
        return self._storages[ref.key]

    def _rebuild_tensor_v2(self, storage: _StorageRef, offset: int, size: tuple, stride: tuple,
                           *_: object) -> tuple[np.ndarray, str] | None:
        """``torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
        requires_grad, backward_hooks[, metadata])``: the strided view of the storage."""
        if storage.kind not in _TORCH_STORAGES:
            return None
        data = self._storage(storage)
        last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if min(size, default=1) > 0 and (offset < 0 or min(stride, default=0) < 0
                                         or last >= data.size):
            raise AudioparityError(
                f"{self._where}: a tensor of size {list(size)}, stride {list(stride)} at offset "
                f"{offset} lies outside its storage data/{storage.key} ({data.size} values)")
        view = np.lib.stride_tricks.as_strided(
            data[offset:], shape=size, strides=[s * data.itemsize for s in stride],
            writeable=False)
        kind = _TORCH_STORAGES[storage.kind][0]
        return to_float32(np.ascontiguousarray(view), kind), kind


def read_torch_state_dict(path: Path, where: str | None = None) -> tuple[dict[str, np.ndarray],
                                                                          dict[str, str]]:
    """Float tensors of a state dict saved by ``torch.save`` (zip format), without torch.

    Records (``torch.serialization``): ``<prefix>/data.pkl`` (the pickle),
    ``<prefix>/data/<key>`` (raw little-endian storage bytes), ``<prefix>/byteorder``.

    Args:
        path: the checkpoint file (e.g. a ``.nemo``'s ``model_weights.ckpt``).
        where: how messages name the file (default ``path``).

    Returns:
        ``(arrays, native)``: name -> float32 array (f16/bf16 widened exactly; read-only), and
        name -> stored dtype ``f32|f16|bf16``. Tensors of other types are left out.

    Raises:
        AudioparityError: not a torch zip checkpoint (e.g. the legacy pre-1.6 format), a
            big-endian one, anything in the pickle besides a flat dict of tensors, or a storage
            record that is missing or of the wrong size.
    """
    where = where or str(path)
    if not zipfile.is_zipfile(path):
        raise AudioparityError(f"{where}: not a torch zip checkpoint (torch.save >= 1.6)")
    with zipfile.ZipFile(path) as archive:
        pickles = [name for name in archive.namelist() if name.endswith("data.pkl")]
        if len(pickles) != 1:
            raise AudioparityError(f"{where}: expected one data.pkl record, found {len(pickles)}")
        prefix = pickles[0].removesuffix("data.pkl")
        if f"{prefix}byteorder" in archive.namelist() and \
                archive.read(f"{prefix}byteorder") != b"little":
            raise AudioparityError(f"{where}: big-endian checkpoint; expected little-endian")
        try:
            state = _StateDictUnpickler(archive, prefix, where).load()
        except (pickle.UnpicklingError, EOFError, TypeError, ValueError) as err:
            raise AudioparityError(f"{where}: unreadable data.pkl ({err})") from None
    if not isinstance(state, dict):
        raise AudioparityError(f"{where}: holds a {type(state).__name__}, expected a state dict")
    arrays, native = {}, {}
    for name, value in state.items():
        if value is None:
            continue
        if not (isinstance(name, str) and isinstance(value, tuple)):
            raise AudioparityError(f"{where}: entry {name!r} is not a tensor")
        arrays[name], native[name] = value
    return arrays, native


def _read_nemo_state(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    # Extracted to a temporary file so the zip can be read by random access.
    with tempfile.TemporaryDirectory(prefix="audioparity_ckpt_") as scratch:
        ckpt = Path(scratch) / "model_weights.ckpt"
        with open(ckpt, "wb") as out:
            copy_nemo_member(path, "model_weights.ckpt", out)
        return read_torch_state_dict(ckpt, where=f"{path}: model_weights.ckpt")


def hf_to_nemo_name(name: str) -> str:
    """NeMo name of a Hugging Face Parakeet key (:data:`HF_TO_NEMO`)."""
    for pattern, replacement in HF_TO_NEMO:
        name = re.sub(pattern, replacement, name)
    return name


def _read_hf_state(directory: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The F32/F16/BF16 tensors of a Hugging Face directory's safetensors files, NeMo-named;
    tensors of other dtypes (integers, f64) are left out."""
    arrays, native = {}, {}
    for name, entry in checkpoint_entries(directory).items():
        if entry.dtype in DTYPES:
            arrays[hf_to_nemo_name(name)] = entry.read()
            native[hf_to_nemo_name(name)] = entry.kind
    return arrays, native


def read_state(model: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every float tensor of a ``.nemo`` file or Hugging Face directory, NeMo-named, as float32,
    and each one's stored dtype (``f32|f16|bf16``)."""
    model = Path(model)
    return _read_hf_state(model) if model.is_dir() else _read_nemo_state(model)


def _check_shapes(state: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]],
                  model: Path) -> None:
    missing = [name for name in expected if name not in state]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise AudioparityError(f"{model}: missing tensor {missing[0]!r}{more}; expected shape "
                               f"{list(expected[missing[0]])}")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise AudioparityError(f"{model}: tensor {name!r} has shape "
                                   f"{list(state[name].shape)}, expected {list(shape)}")


def read_checked_state(model: Path, config: ParakeetTDTConfig) -> tuple[dict[str, np.ndarray],
                                                                         dict[str, str]]:
    """:func:`read_state`, checked: every tensor of :func:`expected_shapes` present with its
    shape, and every float tensor finite. The reference dump runs the same check before NeMo
    loads the checkpoint, so both sides refuse a bad one with the same message.

    Raises:
        AudioparityError: an unreadable checkpoint, a missing tensor, a shape that differs from
            the config's (naming the key and both shapes), or a tensor holding NaN or infinity
            (naming it and the counts).
    """
    state, native = read_state(model)
    _check_shapes(state, expected_shapes(config), Path(model))
    for name, array in state.items():
        check_finite(name, array, Path(model))
    return state, native


def fold_batch_norm(weight: np.ndarray, bias: np.ndarray | None, gamma: np.ndarray,
                    beta: np.ndarray, mean: np.ndarray, var: np.ndarray,
                    eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Fold eval-mode ``BatchNorm1d`` into the conv before it (float64 arithmetic).

    ``BN(conv(x) + b) = conv'(x) + b'`` with ``s = gamma / sqrt(var + eps)``,
    ``w' = w * s[c]`` and ``b' = (b - mean) * s + beta``. ``weight`` is ``[C, ...]``.
    Returns float32 ``(w', b')``.
    """
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    b = np.zeros_like(scale) if bias is None else bias.astype(np.float64)
    folded_w = weight.astype(np.float64) * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
    folded_b = (b - mean.astype(np.float64)) * scale + beta.astype(np.float64)
    return folded_w.astype(np.float32), folded_b.astype(np.float32)


_CONV_KERNEL = re.compile(r"(pre_encode\.conv\.\d+|depthwise_conv)\.weight$")
_POINTWISE = re.compile(r"(pre_encode\.conv\.\d+|pointwise_conv\d)\.weight$")
_NORM_WEIGHT = re.compile(r"(norm_\w+|batch_norm)\.weight$")


def _kind(name: str, array: np.ndarray) -> str:
    """``matmul``, ``conv`` (4-D 3x3 and depthwise kernels) or ``f32`` (norms, biases,
    ``pos_bias_u/v``) for a canonical name, after pointwise kernels were squeezed to 2-D."""
    if _NORM_WEIGHT.search(name) or not (name.endswith(".weight") or ".weight_" in name):
        return "f32"
    if _CONV_KERNEL.search(name) and array.ndim == 4:
        return "conv"
    return "matmul"


_BATCH_NORM = re.compile(r"^(.*\.conv\.)batch_norm\.running_var$")


def to_graph_layout(state: dict[str, np.ndarray], eps: float) -> dict[str, np.ndarray]:
    """The arrays the graphs use, from NeMo-named checkpoint arrays (any subset of a model).

    1x1 conv kernels ``[out, in, 1(, 1)]`` become matrices ``[out, in]``; every conv module's
    ``batch_norm`` (``BatchNorm1d``, ``eps``) is folded into its ``depthwise_conv``, whose kernel
    ``[C, 1, k]`` becomes a height-1 2-D kernel ``[C, 1, 1, k]`` with a ``[C]`` bias. Other
    arrays pass through unchanged.
    """
    arrays = dict(state)
    for name, array in state.items():
        if _POINTWISE.search(name) and array.ndim >= 3 and all(n == 1 for n in array.shape[2:]):
            arrays[name] = array.reshape(array.shape[:2])
        match = _BATCH_NORM.match(name)
        if match:
            p = match.group(1)
            bn = {key: arrays.pop(f"{p}batch_norm.{key}")
                  for key in ("weight", "bias", "running_mean", "running_var")}
            kernel = state[f"{p}depthwise_conv.weight"]
            weight, bias = fold_batch_norm(kernel, state.get(f"{p}depthwise_conv.bias"),
                                           bn["weight"], bn["bias"], bn["running_mean"],
                                           bn["running_var"], eps)
            arrays[f"{p}depthwise_conv.weight"] = weight.reshape(kernel.shape[0], 1, 1, -1)
            arrays[f"{p}depthwise_conv.bias"] = bias
    return arrays


def _check_types(matmul_weight_type: str, conv_weight_type: str) -> None:
    if matmul_weight_type not in MATMUL_WEIGHT_TYPES:
        raise AudioparityError(f"unknown matmul weight type {matmul_weight_type!r}; valid: "
                               f"{', '.join(MATMUL_WEIGHT_TYPES)}")
    if conv_weight_type not in CONV_WEIGHT_TYPES:
        raise AudioparityError(f"unknown conv weight type {conv_weight_type!r}; valid: "
                               f"{', '.join(CONV_WEIGHT_TYPES)}")


def storage_types(arrays: dict[str, np.ndarray], native: dict[str, str],
                  matmul_weight_type: str, conv_weight_type: str) -> tuple[dict[str, str],
                                                                           list[str]]:
    """Storage type of every graph array (module docstring) and one note per fallback.

    Raises:
        AudioparityError: an unknown weight type.
    """
    _check_types(matmul_weight_type, conv_weight_type)
    storage, notes = {}, []
    for name, array in arrays.items():
        kind = _kind(name, array)
        if kind == "matmul":
            wanted = native.get(name, "f32") if matmul_weight_type == "native" \
                else matmul_weight_type
        elif kind == "conv":
            wanted = conv_weight_type
        else:
            wanted = "f32"
        if not storage_supported(wanted, array.shape):
            notes.append(f"{name} {list(array.shape)}: {wanted} needs rows of a multiple of its "
                         f"block size; stored as {FALLBACK_STORAGE}")
            wanted = FALLBACK_STORAGE
        storage[name] = wanted
    return storage, notes


def load_weights(model: Path, config: ParakeetTDTConfig, matmul_weight_type: str = "native",
                 conv_weight_type: str = "f32") -> ParakeetWeights:
    """Read, check, fold and type the weights of ``model`` (module docstring).

    Args:
        model: ``.nemo`` file or Hugging Face Parakeet directory.
        config: its :class:`ParakeetTDTConfig` (shapes are checked against it).
        matmul_weight_type: ``native|f32|f16|bf16|q8_0``.
        conv_weight_type: ``f32|f16``.

    Raises:
        AudioparityError: unknown types, or see :func:`read_checked_state`.
    """
    _check_types(matmul_weight_type, conv_weight_type)
    state, native_all = read_checked_state(model, config)
    expected = expected_shapes(config)
    arrays = to_graph_layout({name: state[name] for name in expected},
                             config.encoder.batch_norm_eps)
    native = {name: native_all.get(name, "f32") for name in arrays}
    storage, notes = storage_types(arrays, native, matmul_weight_type, conv_weight_type)
    preprocessor = {name: array for name, array in state.items()
                    if name.startswith("preprocessor.featurizer.")}
    return ParakeetWeights(arrays=arrays, storage=storage, native=native,
                           preprocessor=preprocessor, notes=notes)
