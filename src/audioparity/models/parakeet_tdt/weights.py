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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
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
    """Parakeet-TDT weights ready to stream into ggml: their graph shapes and storage types,
    and the open checkpoint they are read from (:meth:`upload` reads them then, one at a time).

    Attributes:
        shapes: canonical (NeMo) name -> shape the graphs use (module doc).
        storage: name -> ``f32|f16|bf16|q8_0``.
        native: name -> the checkpoint's dtype (``f32|f16|bf16``).
        preprocessor: the checkpoint's frontend buffers (``preprocessor.featurizer.fb``
            ``[1, n_mels, n_fft/2+1]``, ``preprocessor.featurizer.window`` ``[win_length]``),
            when it has them (a ``.nemo`` does, a Hugging Face directory does not).
        notes: one line per storage fallback.
        model: the checkpoint; sources: the checkpoint tensors (NeMo names, shapes) the graph
            weights are made from (:func:`expected_shapes`); eps: the BatchNorm eps folded into
            the depthwise convs.
    """

    shapes: dict[str, tuple[int, ...]]
    storage: dict[str, str]
    native: dict[str, str]
    preprocessor: dict[str, np.ndarray] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    model: Path = Path()
    sources: dict[str, tuple[int, ...]] = field(default_factory=dict)
    eps: float = 1e-5
    _checkpoint: Checkpoint | None = field(default=None, repr=False)

    def upload(self, runtime: Runtime) -> Weights:
        """Stream every weight once into ``runtime``'s backend, each in its storage type: the
        buffer is allocated from :attr:`shapes`, then each tensor is read, checked finite,
        laid out (:func:`graph_layout`), converted and copied before the next is read
        (:meth:`Runtime.load`); then the checkpoint's other float tensors are checked finite.
        The checkpoint :func:`load_weights` opened is closed after (a second call opens it
        again).

        Raises:
            AudioparityError: a tensor holding NaN or infinity (see :func:`check_weights`).
        """
        checkpoint, self._checkpoint = self._checkpoint or Checkpoint(self.model), None
        with checkpoint:
            layout = graph_layout(self.sources, checkpoint.read, self.eps)
            weights = runtime.load(self.shapes, self.storage,
                                   ((name, 0, make()) for name, (_, make) in layout.items()))
            for name in checkpoint.entries.keys() - self.sources.keys() - self.preprocessor.keys():
                checkpoint.read(name)
        return weights

    def close(self) -> None:
        """Close the checkpoint :func:`load_weights` opened, if :meth:`upload` did not."""
        if self._checkpoint is not None:
            self._checkpoint.close()
            self._checkpoint = None


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


@dataclass(frozen=True)
class TorchEntry:
    """One float tensor of a torch zip checkpoint, as its ``data.pkl`` describes it; nothing
    read yet.

    Attributes:
        path: the checkpoint file; where: how messages name it; record: its storage's zip
            record (``<prefix>data/<key>``).
        kind: the stored dtype ``f32|f16|bf16``; shape: numpy shape; offset, stride: in values
            of the storage (``torch._utils._rebuild_tensor_v2``).
    """

    path: Path
    where: str
    record: str
    kind: str
    shape: tuple[int, ...]
    offset: int
    stride: tuple[int, ...]

    def read(self) -> np.ndarray:
        """The tensor as a new float32 array (f16/bf16 widened exactly), read from its storage
        record alone (a zip member read; the other records stay on disk)."""
        with zipfile.ZipFile(self.path) as archive:
            data = np.frombuffer(archive.read(self.record), dtype=_NUMPY_DTYPES[self.kind])
        view = np.lib.stride_tricks.as_strided(
            data[self.offset:], shape=self.shape,
            strides=[s * data.itemsize for s in self.stride], writeable=False)
        return to_float32(np.ascontiguousarray(view), self.kind)


#: stored dtype -> numpy dtype of its bytes.
_NUMPY_DTYPES = dict(_TORCH_STORAGES.values())


class _StateDictUnpickler(pickle.Unpickler):
    """Reads the ``data.pkl`` of a torch zip checkpoint holding a flat state dict.

    Allows only the globals ``torch.save(state_dict)`` writes (a subset of torch's
    ``_weights_only_unpickler`` allow-list): ``collections.OrderedDict``,
    ``torch._utils._rebuild_tensor_v2`` and the storage classes; storages are the persistent ids
    ``("storage", storage class, key, location, numel)`` (``torch.serialization._save``).
    Float tensors become :class:`TorchEntry` (each storage record's size checked against the
    zip directory; no data read), others None.
    """

    def __init__(self, archive: zipfile.ZipFile, path: Path, prefix: str, where: str) -> None:
        super().__init__(archive.open(f"{prefix}data.pkl"))
        self._archive, self._path, self._prefix, self._where = archive, path, prefix, where

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

    def _record(self, ref: _StorageRef) -> str:
        record = f"{self._prefix}data/{ref.key}"
        try:
            size = self._archive.getinfo(record).file_size
        except KeyError:
            raise AudioparityError(f"{self._where}: no record data/{ref.key}") from None
        itemsize = np.dtype(_TORCH_STORAGES[ref.kind][1]).itemsize
        if size != ref.numel * itemsize:
            raise AudioparityError(
                f"{self._where}: record data/{ref.key} holds {size} bytes, expected "
                f"{ref.numel} x {ref.kind} ({ref.numel * itemsize} bytes)")
        return record

    def _rebuild_tensor_v2(self, storage: _StorageRef, offset: int, size: tuple, stride: tuple,
                           *_: object) -> TorchEntry | None:
        """``torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
        requires_grad, backward_hooks[, metadata])``: the strided view of the storage."""
        if storage.kind not in _TORCH_STORAGES:
            return None
        record = self._record(storage)
        last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if min(size, default=1) > 0 and (offset < 0 or min(stride, default=0) < 0
                                         or last >= storage.numel):
            raise AudioparityError(
                f"{self._where}: a tensor of size {list(size)}, stride {list(stride)} at offset "
                f"{offset} lies outside its storage data/{storage.key} ({storage.numel} values)")
        return TorchEntry(self._path, self._where, record, _TORCH_STORAGES[storage.kind][0],
                          tuple(size), offset, tuple(stride))


def torch_entries(path: Path, where: str | None = None) -> dict[str, TorchEntry]:
    """Float tensors of a state dict saved by ``torch.save`` (zip format), without torch and
    without reading their data (only ``data.pkl`` and the zip directory).

    Records (``torch.serialization``): ``<prefix>/data.pkl`` (the pickle),
    ``<prefix>/data/<key>`` (raw little-endian storage bytes), ``<prefix>/byteorder``.

    Args:
        path: the checkpoint file (e.g. a ``.nemo``'s ``model_weights.ckpt``).
        where: how messages name the file (default ``path``).

    Returns:
        name -> :class:`TorchEntry`; tensors of other types are left out.

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
            state = _StateDictUnpickler(archive, Path(path), prefix, where).load()
        except (pickle.UnpicklingError, EOFError, TypeError, ValueError) as err:
            raise AudioparityError(f"{where}: unreadable data.pkl ({err})") from None
    if not isinstance(state, dict):
        raise AudioparityError(f"{where}: holds a {type(state).__name__}, expected a state dict")
    entries = {}
    for name, value in state.items():
        if value is None:
            continue
        if not (isinstance(name, str) and isinstance(value, TorchEntry)):
            raise AudioparityError(f"{where}: entry {name!r} is not a tensor")
        entries[name] = value
    return entries


def read_torch_state_dict(path: Path, where: str | None = None) -> tuple[dict[str, np.ndarray],
                                                                          dict[str, str]]:
    """Every float tensor of :func:`torch_entries`, read: ``(arrays, native)``, name -> float32
    array (f16/bf16 widened exactly), and name -> stored dtype ``f32|f16|bf16``.

    Raises:
        AudioparityError: see :func:`torch_entries`.
    """
    entries = torch_entries(path, where)
    return ({name: entry.read() for name, entry in entries.items()},
            {name: entry.kind for name, entry in entries.items()})


def hf_to_nemo_name(name: str) -> str:
    """NeMo name of a Hugging Face Parakeet key (:data:`HF_TO_NEMO`)."""
    for pattern, replacement in HF_TO_NEMO:
        name = re.sub(pattern, replacement, name)
    return name


class Checkpoint:
    """The float tensors of a ``.nemo`` file or Hugging Face directory, NeMo-named, from the
    headers; each read on demand. A context manager: a ``.nemo``'s ``model_weights.ckpt`` is
    extracted to a temporary file (so its zip can be read by random access) until
    :meth:`close`.

    Attributes:
        model: the checkpoint.
        entries: NeMo name -> entry (``.shape``, ``.kind`` ``f32|f16|bf16``, ``.read()``):
            :class:`TorchEntry` of a ``.nemo``, :class:`~audioparity.checkpoint.Entry` of a
            Hugging Face directory's F32/F16/BF16 tensors (others are left out).

    Raises:
        AudioparityError: an unreadable checkpoint (see :func:`torch_entries`,
            :func:`~audioparity.checkpoint.checkpoint_entries`).
    """

    def __init__(self, model: Path) -> None:
        self.model = Path(model)
        self._scratch: tempfile.TemporaryDirectory | None = None
        if self.model.is_dir():
            self.entries = {hf_to_nemo_name(name): entry
                            for name, entry in checkpoint_entries(self.model).items()
                            if entry.dtype in DTYPES}
            return
        self._scratch = tempfile.TemporaryDirectory(prefix="audioparity_ckpt_")
        try:
            ckpt = Path(self._scratch.name) / "model_weights.ckpt"
            with open(ckpt, "wb") as out:
                copy_nemo_member(self.model, "model_weights.ckpt", out)
            self.entries = torch_entries(ckpt, where=f"{self.model}: model_weights.ckpt")
        except BaseException:
            self.close()
            raise

    @property
    def native(self) -> dict[str, str]:
        """Name -> stored dtype ``f32|f16|bf16``."""
        return {name: entry.kind for name, entry in self.entries.items()}

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a new float32 array, checked finite.

        Raises:
            AudioparityError: the tensor holds NaN or infinity (named, with the counts).
        """
        array = self.entries[name].read()
        check_finite(name, array, self.model)
        return array

    def check_shapes(self, expected: dict[str, tuple[int, ...]]) -> None:
        """Every tensor of ``expected`` present with its shape (headers only).

        Raises:
            AudioparityError: a missing tensor, or a shape that differs (naming the key and
                both shapes).
        """
        missing = [name for name in expected if name not in self.entries]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise AudioparityError(f"{self.model}: missing tensor {missing[0]!r}{more}; "
                                   f"expected shape {list(expected[missing[0]])}")
        for name, shape in expected.items():
            if tuple(self.entries[name].shape) != shape:
                raise AudioparityError(f"{self.model}: tensor {name!r} has shape "
                                       f"{list(self.entries[name].shape)}, expected {list(shape)}")

    def close(self) -> None:
        """Remove the temporary copy of a ``.nemo``'s weights."""
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_state(model: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every float tensor of a ``.nemo`` file or Hugging Face directory, NeMo-named, as float32,
    and each one's stored dtype (``f32|f16|bf16``); not checked (for tests and analysis)."""
    with Checkpoint(model) as checkpoint:
        return ({name: entry.read() for name, entry in checkpoint.entries.items()},
                checkpoint.native)


def check_weights(model: Path, config: ParakeetTDTConfig) -> None:
    """The checks of :func:`load_weights` and :meth:`ParakeetWeights.upload`, reading one
    tensor at a time and keeping none: every tensor of :func:`expected_shapes` present with its
    shape, and every float tensor finite. The reference dump runs them before NeMo loads the
    checkpoint, so both sides refuse a bad one with the same message.

    Raises:
        AudioparityError: an unreadable checkpoint, a missing tensor, a shape that differs from
            the config's (naming the key and both shapes), or a tensor holding NaN or infinity
            (naming it and the counts).
    """
    with Checkpoint(model) as checkpoint:
        checkpoint.check_shapes(expected_shapes(config))
        for name in checkpoint.entries:
            checkpoint.read(name)


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
_BATCH_NORM = re.compile(r"^(.*\.conv\.)batch_norm\.(weight|bias|running_mean|running_var)$")
_BN_KEYS = ("weight", "bias", "running_mean", "running_var")


def _kind(name: str, shape: tuple[int, ...]) -> str:
    """``matmul``, ``conv`` (4-D 3x3 and depthwise kernels) or ``f32`` (norms, biases,
    ``pos_bias_u/v``) for a canonical name, after pointwise kernels were squeezed to 2-D."""
    if _NORM_WEIGHT.search(name) or not (name.endswith(".weight") or ".weight_" in name):
        return "f32"
    if _CONV_KERNEL.search(name) and len(shape) == 4:
        return "conv"
    return "matmul"


Layout = dict[str, tuple[tuple[int, ...], Callable[[], np.ndarray]]]


def _folded(read: Callable[[str], np.ndarray], p: str, has_bias: bool,
            eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Conv module ``p``'s depthwise kernel ``[C, 1, 1, k]`` and bias ``[C]`` with its
    BatchNorm folded in (:func:`fold_batch_norm`)."""
    kernel = read(f"{p}depthwise_conv.weight")
    bias = read(f"{p}depthwise_conv.bias") if has_bias else None
    weight, folded_bias = fold_batch_norm(kernel, bias,
                                          *(read(f"{p}batch_norm.{key}") for key in _BN_KEYS),
                                          eps)
    return weight.reshape(kernel.shape[0], 1, 1, -1), folded_bias


def graph_layout(shapes: Mapping[str, tuple[int, ...]], read: Callable[[str], np.ndarray],
                 eps: float) -> Layout:
    """The graph weights made from NeMo-named checkpoint tensors (any subset of a model), as
    ``name -> (graph shape, make)``: ``make()`` reads (``read(name)``) what the weight needs
    and returns it, so a caller can allocate from the shapes and then make one at a time.

    1x1 conv kernels ``[out, in, 1(, 1)]`` become matrices ``[out, in]``; every conv module's
    ``batch_norm`` (``BatchNorm1d``, ``eps``) is folded into its ``depthwise_conv``, whose kernel
    ``[C, 1, k]`` becomes a height-1 2-D kernel ``[C, 1, 1, k]`` with a ``[C]`` bias (the
    ``batch_norm`` tensors are dropped). Other tensors pass through unchanged.
    """
    layout: Layout = {}
    for name, shape in shapes.items():
        match = _BATCH_NORM.match(name)
        if match and f"{match.group(1)}batch_norm.running_var" in shapes:
            if match.group(2) == "running_var":
                p = match.group(1)
                kernel = shapes[f"{p}depthwise_conv.weight"]
                c, k = kernel[0], kernel[-1]
                fold = partial(_folded, read, p, f"{p}depthwise_conv.bias" in shapes, eps)
                layout[f"{p}depthwise_conv.weight"] = ((c, 1, 1, k), lambda f=fold: f()[0])
                layout[f"{p}depthwise_conv.bias"] = ((c,), lambda f=fold: f()[1])
        elif _POINTWISE.search(name) and len(shape) >= 3 and all(n == 1 for n in shape[2:]):
            layout[name] = (tuple(shape[:2]),
                            lambda n=name, s=tuple(shape[:2]): read(n).reshape(s))
        elif name not in layout:
            layout[name] = (tuple(shape), partial(read, name))
    return layout


def to_graph_layout(state: dict[str, np.ndarray], eps: float) -> dict[str, np.ndarray]:
    """:func:`graph_layout` of arrays in memory: the arrays the graphs use."""
    layout = graph_layout({name: array.shape for name, array in state.items()},
                          state.__getitem__, eps)
    return {name: make() for name, (_, make) in layout.items()}


def _check_types(matmul_weight_type: str, conv_weight_type: str) -> None:
    if matmul_weight_type not in MATMUL_WEIGHT_TYPES:
        raise AudioparityError(f"unknown matmul weight type {matmul_weight_type!r}; valid: "
                               f"{', '.join(MATMUL_WEIGHT_TYPES)}")
    if conv_weight_type not in CONV_WEIGHT_TYPES:
        raise AudioparityError(f"unknown conv weight type {conv_weight_type!r}; valid: "
                               f"{', '.join(CONV_WEIGHT_TYPES)}")


def storage_types(shapes: Mapping[str, tuple[int, ...]], native: dict[str, str],
                  matmul_weight_type: str, conv_weight_type: str) -> tuple[dict[str, str],
                                                                           list[str]]:
    """Storage type of every graph weight, from its name and graph shape (module docstring),
    and one note per fallback.

    Raises:
        AudioparityError: an unknown weight type.
    """
    _check_types(matmul_weight_type, conv_weight_type)
    storage, notes = {}, []
    for name, shape in shapes.items():
        kind = _kind(name, shape)
        if kind == "matmul":
            wanted = native.get(name, "f32") if matmul_weight_type == "native" \
                else matmul_weight_type
        elif kind == "conv":
            wanted = conv_weight_type
        else:
            wanted = "f32"
        if not storage_supported(wanted, shape):
            notes.append(f"{name} {list(shape)}: {wanted} needs rows of a multiple of its "
                         f"block size; stored as {FALLBACK_STORAGE}")
            wanted = FALLBACK_STORAGE
        storage[name] = wanted
    return storage, notes


def load_weights(model: Path, config: ParakeetTDTConfig, matmul_weight_type: str = "native",
                 conv_weight_type: str = "f32") -> ParakeetWeights:
    """Open ``model``, check its tensors' shapes from the headers, and plan the graph weights:
    shapes, storage types, the preprocessor buffers (read); the weights themselves are read
    by :meth:`ParakeetWeights.upload`, one at a time.

    Args:
        model: ``.nemo`` file or Hugging Face Parakeet directory.
        config: its :class:`ParakeetTDTConfig` (shapes are checked against it).
        matmul_weight_type: ``native|f32|f16|bf16|q8_0``.
        conv_weight_type: ``f32|f16``.

    Raises:
        AudioparityError: unknown types, an unreadable checkpoint, a missing tensor or a shape
            that differs from the config's, or a preprocessor buffer holding NaN or infinity
            (the weights are checked finite as they upload; see :func:`check_weights`).
    """
    _check_types(matmul_weight_type, conv_weight_type)
    checkpoint = Checkpoint(model)
    try:
        sources = expected_shapes(config)
        checkpoint.check_shapes(sources)
        eps = config.encoder.batch_norm_eps
        shapes = {name: shape for name, (shape, _) in
                  graph_layout(sources, checkpoint.read, eps).items()}
        native = {name: checkpoint.native.get(name, "f32") for name in shapes}
        storage, notes = storage_types(shapes, native, matmul_weight_type, conv_weight_type)
        preprocessor = {name: checkpoint.read(name) for name in checkpoint.entries
                        if name.startswith("preprocessor.featurizer.")}
    except BaseException:
        checkpoint.close()
        raise
    return ParakeetWeights(shapes=shapes, storage=storage, native=native,
                           preprocessor=preprocessor, notes=notes, model=Path(model),
                           sources=sources, eps=eps, _checkpoint=checkpoint)
