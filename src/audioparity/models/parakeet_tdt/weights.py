"""Parakeet-TDT weights for the ggml port: the graph layout (1x1 convs as matrices, BatchNorm
folded) and the storage type of every tensor, streamed into a ggml buffer.

What :func:`load_weights` plans (canonical names, float32 arrays in the shapes the graphs use):

- every tensor of :func:`~.checkpoint.expected_shapes` as in the checkpoint, except
- 1x1 (pointwise) conv kernels squeezed to matrices ``[out, in]`` (they run as matmuls):
  ``encoder.pre_encode.conv.{3,6}.weight``, ``encoder.layers.{i}.conv.pointwise_conv{1,2}.weight``,
  a CTC decoder's ``{decoder,ctc_decoder}.decoder_layers.0.weight``;
- the conv module's BatchNorm folded into its depthwise conv (eps from the config):
  ``depthwise_conv.weight`` ``[C, 1, 1, k]`` (a 2-D kernel of height 1) and
  ``depthwise_conv.bias`` ``[C]`` (always present); the ``batch_norm.*`` tensors are dropped.

Storage types (a property of each tensor; the graph code has no per-type branches):

- matmul weights (linear layers, pointwise convs, LSTM matrices, the prediction-net embedding,
  the joint, the CTC decoder): the weight type; ``native`` means the checkpoint's own dtype;
- conv kernels (the 3x3 subsampling convs, the depthwise convs): ``conv_weight_type``;
- norms, biases, ``pos_bias_u/v``: always f32.

A block type that cannot hold a tensor (q8_0 needs rows of a multiple of 32 values) falls back to
f16 for that tensor, and :attr:`ParakeetWeights.notes` says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from audioparity.artifacts import model_record
from audioparity.errors import AudioparityError
from audioparity.ggml import Runtime, Weights, storage_or_fallback
from audioparity.models.parakeet_tdt.checkpoint import Checkpoint, expected_shapes
from audioparity.models.parakeet_tdt.config import ParakeetTDTConfig, load_config
from audioparity.vocabulary import FLOAT_STORAGE_TYPES, WEIGHT_TYPES


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

    def upload(self, runtime: Runtime, weights_file: Path | None = None) -> Weights:
        """Stream every weight once into ``runtime``'s backend, each in its storage type: the
        buffer is allocated from :attr:`shapes`, then each tensor is read, checked finite,
        laid out (:func:`graph_layout`), converted and copied before the next is read
        (:meth:`Runtime.load`); then the checkpoint's other float tensors are checked finite.
        With ``weights_file`` (:func:`save_weights` of the same model and types, checked when
        it was written) the weights are mapped from it instead (:meth:`Runtime.map`). The
        checkpoint :func:`load_weights` opened is closed after (a second call opens it again).

        Raises:
            AudioparityError: a tensor holding NaN or infinity (see :func:`check_weights`), or
                a weights file that does not hold these shapes and types.
        """
        checkpoint, self._checkpoint = self._checkpoint or Checkpoint(self.model), None
        with checkpoint:
            if weights_file is not None:
                return runtime.map(weights_file, self.shapes, self.storage)
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
_POINTWISE = re.compile(r"(pre_encode\.conv\.\d+|pointwise_conv\d|decoder_layers\.0)\.weight$")
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


def _check_types(weight_type: str, conv_weight_type: str) -> None:
    if weight_type not in WEIGHT_TYPES:
        raise AudioparityError(f"unknown weight type {weight_type!r}; valid: "
                               f"{', '.join(WEIGHT_TYPES)}")
    if conv_weight_type not in FLOAT_STORAGE_TYPES:
        raise AudioparityError(f"unknown conv weight type {conv_weight_type!r}; valid: "
                               f"{', '.join(FLOAT_STORAGE_TYPES)}")


def storage_types(shapes: Mapping[str, tuple[int, ...]], native: dict[str, str],
                  weight_type: str, conv_weight_type: str) -> tuple[dict[str, str],
                                                                           list[str]]:
    """Storage type of every graph weight, from its name and graph shape (module docstring),
    and one note per fallback.

    Raises:
        AudioparityError: an unknown weight type.
    """
    _check_types(weight_type, conv_weight_type)
    storage, notes = {}, []
    for name, shape in shapes.items():
        kind = _kind(name, shape)
        if kind == "matmul":
            wanted = native.get(name, "f32") if weight_type == "native" \
                else weight_type
        elif kind == "conv":
            wanted = conv_weight_type
        else:
            wanted = "f32"
        storage[name] = storage_or_fallback(name, wanted, shape, notes)
    return storage, notes


def load_weights(model: Path, config: ParakeetTDTConfig, weight_type: str = "native",
                 conv_weight_type: str = "f32") -> ParakeetWeights:
    """Open ``model``, check its tensors' shapes from the headers, and plan the graph weights:
    shapes, storage types, the preprocessor buffers (read); the weights themselves are read
    by :meth:`ParakeetWeights.upload`, one at a time.

    Args:
        model: ``.nemo`` file or Hugging Face Parakeet directory.
        config: its :class:`ParakeetTDTConfig` (shapes are checked against it).
        weight_type: ``native|f32|f16|bf16|q8_0``.
        conv_weight_type: ``f32|f16``.

    Raises:
        AudioparityError: unknown types, an unreadable checkpoint, a missing tensor or a shape
            that differs from the config's, or a preprocessor buffer holding NaN or infinity
            (the weights are checked finite as they upload; see :func:`check_weights`).
    """
    _check_types(weight_type, conv_weight_type)
    checkpoint = Checkpoint(model)
    try:
        sources = expected_shapes(config)
        checkpoint.check_shapes(sources)
        eps = config.encoder.batch_norm_eps
        shapes = {name: shape for name, (shape, _) in
                  graph_layout(sources, checkpoint.read, eps).items()}
        native = {name: checkpoint.native.get(name, "f32") for name in shapes}
        storage, notes = storage_types(shapes, native, weight_type, conv_weight_type)
        preprocessor = {name: checkpoint.read(name) for name in checkpoint.entries
                        if name.startswith("preprocessor.featurizer.")}
    except BaseException:
        checkpoint.close()
        raise
    return ParakeetWeights(shapes=shapes, storage=storage, native=native,
                           preprocessor=preprocessor, notes=notes, model=Path(model),
                           sources=sources, eps=eps, _checkpoint=checkpoint)


def save_weights(model: Path, output: Path, weight_type: str = "native",
                 conv_weight_type: str = "f32") -> None:
    """The model's graph weights at ``weight_type`` (conv kernels at ``conv_weight_type``),
    checked, laid out and converted once, written to the GGUF file ``output``
    (:meth:`Weights.save`) for dumps to map (:meth:`ParakeetWeights.upload`).

    Raises:
        AudioparityError: as :func:`load_weights` and :meth:`ParakeetWeights.upload`.
    """
    host = load_weights(model, load_config(model), weight_type, conv_weight_type)
    with Runtime("cpu") as runtime:
        host.upload(runtime).save(output, model_record(model))
