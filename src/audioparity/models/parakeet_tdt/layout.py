"""Parakeet-TDT weights in the layout the ggml graphs use, and the storage kind of each; nothing
here needs torch or ggml.

The graph weights (canonical NeMo names, float32 arrays in the shapes the graphs use) are every
tensor of :func:`~.checkpoint.expected_shapes` as in the checkpoint, except:

- 1x1 (pointwise) conv kernels squeezed to matrices ``[out, in]`` (they run as matmuls):
  ``encoder.pre_encode.conv.{3,6}.weight``, ``encoder.layers.{i}.conv.pointwise_conv{1,2}.weight``,
  a CTC decoder's ``{decoder,ctc_decoder}.decoder_layers.0.weight``;
- the conv module's BatchNorm folded into its depthwise conv (eps from the config):
  ``depthwise_conv.weight`` ``[C, 1, 1, k]`` (a 2-D kernel of height 1) and
  ``depthwise_conv.bias`` ``[C]`` (always present); the ``batch_norm.*`` tensors are dropped.

Storage kinds (:func:`weight_kind`; a property of each tensor, the graph code has no per-type
branches):

- matmul weights (linear layers, pointwise convs, LSTM matrices, the prediction-net embedding,
  the joint, the CTC decoder): the cell's weight type;
- conv kernels (the 3x3 subsampling convs, the depthwise convs): the option
  ``conv_weight_type``;
- norms, biases, ``pos_bias_u/v``: always f32.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path

import numpy as np

from audioparity.contract.family import CheckpointWeights
from audioparity.contract.spec import FLOAT32, MATMUL
from audioparity.models.parakeet_tdt.checkpoint import Checkpoint, expected_shapes
from audioparity.models.parakeet_tdt.config import ParakeetTDTConfig

#: The option that gives the conv kernels' storage type (:func:`weight_kind`).
CONV_KIND = "conv_weight_type"
#: The checkpoint's frontend buffers (a ``.nemo`` has them, a Hugging Face directory does not):
#: the mel filterbank ``[1, n_mels, n_fft/2+1]`` and the window ``[win_length]``.
FEATURIZER = "preprocessor.featurizer."
FB = FEATURIZER + "fb"
WINDOW = FEATURIZER + "window"

_CONV_KERNEL = re.compile(r"(pre_encode\.conv\.\d+|depthwise_conv)\.weight$")
_POINTWISE = re.compile(r"(pre_encode\.conv\.\d+|pointwise_conv\d|decoder_layers\.0)\.weight$")
_NORM_WEIGHT = re.compile(r"(norm_\w+|batch_norm)\.weight$")
_BATCH_NORM = re.compile(r"^(.*\.conv\.)batch_norm\.(weight|bias|running_mean|running_var)$")
_BN_KEYS = ("weight", "bias", "running_mean", "running_var")

Layout = dict[str, tuple[tuple[int, ...], Callable[[], np.ndarray]]]


def fold_batch_norm(weight: np.ndarray, bias: np.ndarray | None,
                    batch_norm: Mapping[str, np.ndarray], eps: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Fold eval-mode ``BatchNorm1d`` into the conv before it (float64 arithmetic).

    ``BN(conv(x) + b) = conv'(x) + b'`` with ``s = gamma / sqrt(var + eps)``,
    ``w' = w * s[c]`` and ``b' = (b - mean) * s + beta``.

    Args:
        weight: the conv kernel ``[C, ...]``; bias: its ``[C]`` bias, or None.
        batch_norm: the BatchNorm's ``state_dict`` (its ``[C]`` ``weight`` gamma, ``bias``
            beta, ``running_mean`` and ``running_var``; other entries ignored).
        eps: the BatchNorm's ``eps`` (a module attribute, not in its state).

    Returns:
        float32 ``(w', b')``.
    """
    gamma, beta, mean, var = (batch_norm[key] for key in _BN_KEYS)
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    b = np.zeros_like(scale) if bias is None else bias.astype(np.float64)
    folded_w = weight.astype(np.float64) * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
    folded_b = (b - mean.astype(np.float64)) * scale + beta.astype(np.float64)
    return folded_w.astype(np.float32), folded_b.astype(np.float32)


def weight_kind(name: str, shape: tuple[int, ...]) -> str:
    """:data:`~audioparity.contract.spec.MATMUL`, :data:`CONV_KIND` (4-D 3x3 and depthwise
    kernels) or :data:`~audioparity.contract.spec.FLOAT32` (norms, biases, ``pos_bias_u/v``) for a
    graph weight's canonical name and graph shape (pointwise kernels already squeezed to 2-D)."""
    if _NORM_WEIGHT.search(name) or not (name.endswith(".weight") or ".weight_" in name):
        return FLOAT32
    if _CONV_KERNEL.search(name) and len(shape) == 4:
        return CONV_KIND
    return MATMUL


def _folded(read: Callable[[str], np.ndarray], p: str, has_bias: bool,
            eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Conv module ``p``'s depthwise kernel ``[C, 1, 1, k]`` and bias ``[C]`` with its
    BatchNorm folded in (:func:`fold_batch_norm`)."""
    kernel = read(f"{p}depthwise_conv.weight")
    bias = read(f"{p}depthwise_conv.bias") if has_bias else None
    batch_norm = {key: read(f"{p}batch_norm.{key}") for key in _BN_KEYS}
    weight, folded_bias = fold_batch_norm(kernel, bias, batch_norm, eps)
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


def checkpoint_weights(model: Path, config: ParakeetTDTConfig) -> CheckpointWeights:
    """The graph weights of ``model`` planned from its headers (module docstring): their
    shapes in :func:`graph_layout` order, the checkpoint's dtype of each (``f32`` for a folded
    bias the checkpoint lacks), and the featurizer buffers (:data:`FB`, :data:`WINDOW`, read
    and checked finite now). ``blocks()`` reads each weight whole (checked finite), then reads
    the checkpoint's other float tensors to check them finite too.

    Raises:
        AudioparityError: an unreadable checkpoint, a missing tensor or a shape that differs
            from the config's, or a featurizer buffer holding NaN or infinity.
    """
    checkpoint = Checkpoint(model)
    try:
        sources = expected_shapes(config)
        checkpoint.check_shapes(sources)
        layout = graph_layout(sources, checkpoint.read, config.encoder.batch_norm_eps)
        buffers = {name: checkpoint.read(name) for name in checkpoint.entries
                   if name.startswith(FEATURIZER)}
    except BaseException:
        checkpoint.close()
        raise

    def blocks() -> Iterator[tuple[str, int, np.ndarray]]:
        for name, (_, make) in layout.items():
            yield name, 0, make()
        for name in checkpoint.entries.keys() - sources.keys() - buffers.keys():
            checkpoint.read(name)

    return CheckpointWeights(
        shapes={name: shape for name, (shape, _) in layout.items()},
        native={name: checkpoint.native.get(name, "f32") for name in layout},
        blocks=blocks, buffers=buffers, close=checkpoint.close)
