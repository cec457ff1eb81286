"""The Whisper encoder as ggml graphs, block by block as in transformers.

Read beside ``transformers.models.whisper.modeling_whisper``: ``WhisperEncoder.forward`` is
:func:`conv_stack` (``gelu(conv1(x))``, ``gelu(conv2(...))``), :func:`add_positions`
(``+ embed_positions``), the layers, and the final ``layer_norm``; :func:`encoder_layer` is
``WhisperEncoderLayer`` (pre-norm: ``self_attn_layer_norm`` -> :func:`self_attention` ->
residual; ``final_layer_norm`` -> ``fc1`` -> GELU -> ``fc2`` -> residual) and
:func:`self_attention` is ``WhisperAttention`` with ``eager_attention_forward``
(:func:`attention`, which the decoder's attentions share). Weight names are ``WhisperModel``'s
own (``encoder.*``, :mod:`.checkpoint`).

Shapes in docstrings are transformers', batch dropped: ``[T, D]`` is time-major. ggml's ``ne``
is the reverse, so a ``[T, D]`` activation is a ggml tensor with ``ne = [D, T]``; the conv
inputs are channel-major ``[C, T]`` (``ne = [T, C]``), as ``nn.Conv1d`` takes them. Batch size
1 and no attention mask, as ``WhisperEncoder`` runs (it takes no mask).

Every weight's storage type (any of :data:`~audioparity.contract.vocabulary.STORAGE_TYPES`) is
carried by
the tensor itself: the same graph builders serve every weight type and backend.
"""

from __future__ import annotations

from collections.abc import Sequence

import ggml
import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.ggml import Runtime, Weights
from audioparity.ggml.ops import SGEMM_INNER_MULTIPLE, layer_norm, linear
from audioparity.models.whisper.config import (
    CONV_STRIDES,
    LAYER_NORM_EPS,
    EncoderConfig,
    WhisperModelConfig,
)
from audioparity.models.whisper.spec import Names


def gelu(ctx, x):
    """The exact GELU, ``0.5 x (1 + erf(x / sqrt 2))``: ``nn.functional.gelu`` after each conv
    and ``ACT2FN["gelu"]`` after ``fc1``. ``ggml_gelu_erf``; ``ggml_gelu`` is the tanh
    approximation (``gelu_new``), another function."""
    return ggml.ggml_gelu_erf(ctx, x)


def conv1d(ctx, w: Weights, name: str, x, stride: int, padding: int):
    """``torch.nn.Conv1d`` named ``name`` (groups 1, dilation 1, with its bias), in float32:
    ``ggml_im2col`` to F32 columns, then one matmul.

    Not ``ggml_conv_1d``: its im2col is always F16, which rounds the activations (and, in the
    matmul against it, the kernel) to f16 inside an f32 path. The columns and the kernel rows
    (``in * k`` values) are zero-padded to a multiple of :data:`SGEMM_INNER_MULTIPLE`, so the
    matmul runs in llamafile's sgemm; the zeros add nothing to the sums.

    Args:
        name: ``{name}.weight`` ``[out, in, k]`` (ne ``[k, in, out]``, f32), ``{name}.bias``
            ``[out]``.
        x: ``[in, T]`` (ne ``[T, in]``), channel-major, contiguous.

    Returns:
        ``[T', out]`` (ne ``[out, T']``), time-major, ``T' = (T + 2 padding - k) // stride + 1``.
    """
    kernel = w[name + ".weight"]
    k, n_in, n_out = (kernel.contents.ne[i] for i in range(3))
    columns = ggml.ggml_im2col(ctx, kernel, x, stride, 0, padding, 0, 1, 0, False,
                               ggml.GGML_TYPE_F32)  # ne [in * k, T']
    n_frames = columns.contents.ne[1]
    inner = n_in * k
    pad = -inner % SGEMM_INNER_MULTIPLE
    columns = ggml.ggml_pad(ctx, ggml.ggml_reshape_2d(ctx, columns, inner, n_frames),
                            pad, 0, 0, 0)
    rows = ggml.ggml_pad(ctx, ggml.ggml_reshape_2d(ctx, kernel, inner, n_out), pad, 0, 0, 0)
    out = ggml.ggml_mul_mat(ctx, rows, columns)  # ne [out, T']
    return ggml.ggml_add(ctx, out, w[name + ".bias"])


def _channel_major(ctx, x):
    """``[T, C]`` (ne ``[C, T]``) -> ``[C, T]`` (ne ``[T, C]``), contiguous."""
    return ggml.ggml_cont(ctx, ggml.ggml_transpose(ctx, x))


def conv_stack(ctx, w: Weights, mel):
    """The head of ``WhisperEncoder.forward``: ``gelu(conv1(x))`` (kernel 3, padding 1), then
    ``gelu(conv2(...))`` (kernel 3, stride 2, padding 1), both exact GELU (:func:`gelu`).

    Args:
        mel: ``[T, n_mels]`` (ne ``[n_mels, T]``), time-major as dumped.

    Returns:
        ``[T', D]`` with ``T' = (T - 1) // 2 + 1``: the ``conv_out`` stage (before the
        positions are added).
    """
    x = gelu(ctx, conv1d(ctx, w, "encoder.conv1", _channel_major(ctx, mel), CONV_STRIDES[0], 1))
    return gelu(ctx, conv1d(ctx, w, "encoder.conv2", _channel_major(ctx, x), CONV_STRIDES[1], 1))


def add_positions(ctx, w: Weights, x):
    """``inputs_embeds + embed_positions(all_positions)``: the learned position table (Whisper
    initialises it with sinusoids; the checkpoint's values are used) added row by row.

    Args:
        x: ``[T', D]``, ``T'`` at most ``max_source_positions`` (the first ``T'`` rows are
            used; ``WhisperEncoder`` accepts only ``T' = max_source_positions``).

    Returns:
        ``[T', D]``.
    """
    table = w["encoder.embed_positions.weight"]  # ne [D, max_source_positions]
    n_frames = x.contents.ne[1]
    rows = ggml.ggml_view_2d(ctx, table, table.contents.ne[0], n_frames, table.contents.nb[1], 0)
    return ggml.ggml_add(ctx, x, rows)


def attention(ctx, n_head: int, q, k, v, mask=None):
    """``eager_attention_forward`` with ``scaling=1.0`` (the query comes scaled, as
    ``WhisperAttention`` scales its projection): ``softmax(q k^T + mask) v`` per head.

    Args:
        q: ``[S_q, D]`` (ne ``[D, S_q]``), ``q_proj(x) * head_dim ** -0.5``.
        k, v: ``[S_k, D]`` (ne ``[D, S_k]``), contiguous (a cache's first rows are).
        mask: None, or an additive ``[S_q, S_k]`` float32 (``0`` or ``-inf``: the causal mask).

    Returns:
        ``[S_q, D]``, the heads concatenated, before ``out_proj``.
    """
    d = q.contents.ne[0]
    head_dim, n_q, n_k = d // n_head, q.contents.ne[1], k.contents.ne[1]

    def per_head(t, n):  # ne [D, n] -> ne [head_dim, n, H]
        return ggml.ggml_permute(ctx, ggml.ggml_reshape_3d(ctx, t, head_dim, n_head, n),
                                 0, 2, 1, 3)

    # A contiguous query keeps q k^T in llamafile's sgemm; contiguous keys keep it in f32 on
    # Vulkan (ggml-vulkan converts a strided left-hand side to f16 first).
    scores = ggml.ggml_mul_mat(ctx, ggml.ggml_cont(ctx, per_head(k, n_k)),
                               ggml.ggml_cont(ctx, per_head(q, n_q)))  # ne [S_k, S_q, H]
    probs = ggml.ggml_soft_max_ext(ctx, scores, mask, 1.0, 0.0)
    # S_k zero-padded to the inner length llamafile's sgemm takes (exact zeros in each sum)
    pad = -n_k % SGEMM_INNER_MULTIPLE
    v_t = ggml.ggml_reshape_3d(ctx, v, head_dim, n_head, n_k)
    v_t = ggml.ggml_pad(ctx, ggml.ggml_permute(ctx, v_t, 1, 2, 0, 3), pad, 0, 0, 0)
    probs = ggml.ggml_pad(ctx, probs, pad, 0, 0, 0)  # ne [S_k + pad, S_q, H]
    out = ggml.ggml_mul_mat(ctx, v_t, probs)  # [H, S_q, head_dim] (ne [head_dim, S_q, H])
    out = ggml.ggml_cont(ctx, ggml.ggml_permute(ctx, out, 0, 2, 1, 3))  # ne [head_dim, H, S_q]
    return ggml.ggml_reshape_2d(ctx, out, d, n_q)


def self_attention(ctx, w: Weights, prefix: str, cfg: EncoderConfig, x):
    """``WhisperAttention`` (self-attention, no mask, eager):
    ``q = q_proj(x) * head_dim ** -0.5`` (q_proj with bias; the scale applied to the
    projection, as transformers does, and none in the softmax), ``k = k_proj(x)`` (no bias),
    ``v = v_proj(x)``, split in H heads; ``out_proj(softmax(q k^T) v)`` (:func:`attention`).

    Args:
        x: ``[T, D]`` (after ``self_attn_layer_norm``).

    Returns:
        ``[T, D]``.
    """
    q = ggml.ggml_scale(ctx, linear(ctx, w, prefix + "q_proj", x), cfg.head_dim**-0.5)
    k = linear(ctx, w, prefix + "k_proj", x)
    v = linear(ctx, w, prefix + "v_proj", x)
    return linear(ctx, w, prefix + "out_proj", attention(ctx, cfg.encoder_attention_heads,
                                                         q, k, v))


def encoder_layer(ctx, w: Weights, index: int, cfg: EncoderConfig, x):
    """``WhisperEncoderLayer`` (pre-norm): ``x += self_attn(self_attn_layer_norm(x))``, then
    ``x += fc2(gelu(fc1(final_layer_norm(x))))``.

    Args:
        x: ``[T, D]``.

    Returns:
        ``[T, D]``.
    """
    p = f"encoder.layers.{index}."

    def norm(name, t):
        return layer_norm(ctx, t, w[f"{p}{name}.weight"], w[f"{p}{name}.bias"], LAYER_NORM_EPS)

    x = ggml.ggml_add(ctx, x, self_attention(ctx, w, p + "self_attn.", cfg,
                                             norm("self_attn_layer_norm", x)))
    h = gelu(ctx, linear(ctx, w, p + "fc1", norm("final_layer_norm", x)))
    return ggml.ggml_add(ctx, x, linear(ctx, w, p + "fc2", h))


def final_layer_norm(ctx, w: Weights, x):
    """``WhisperEncoder.layer_norm`` after the last layer: x ``[T, D]`` -> ``[T, D]``."""
    return layer_norm(ctx, x, w["encoder.layer_norm.weight"], w["encoder.layer_norm.bias"],
                      LAYER_NORM_EPS)


class Encoder:
    """transformers' ``WhisperEncoder`` on a ggml runtime.

    Args:
        weights: uploaded weights (:func:`audioparity.dumping.driver.upload_weights`),
            ``WhisperModel`` names.
        config: the model config (its ``encoder`` part is used).
        runtime: the runtime the weights live on.

    Example::

        config = load_config(model)
        with Runtime("cpu", threads=4) as rt:
            weights, _ = upload_weights(Whisper(), rt, model, config,
                                        RunSettings("f32", "cpu", {}))
            taps = Encoder(weights, config, rt).forward(mel)   # mel [3000, n_mels]
            taps["enc_out"]                                    # [1500, D]
    """

    def __init__(self, weights: Weights, config: WhisperModelConfig, runtime: Runtime) -> None:
        self.weights = weights
        self.cfg = config.encoder
        self.runtime = runtime

    def forward(self, mel: np.ndarray) -> dict[str, np.ndarray]:
        """The whole encoder in one graph, with every tap.

        Args:
            mel: ``[T, n_mels]`` float32; ``T' = (T - 1) // 2 + 1`` at most
                ``max_source_positions`` (the frontend gives ``T = 2 max_source_positions``).

        Returns:
            ``conv_out`` ``[T', D]`` (before the positions), ``layer_{i}`` ``[T', D]`` for every
            layer, ``enc_out`` ``[T', D]`` (after the final ``layer_norm``), all float32.

        Raises:
            AudioparityError: mel is not ``[T, num_mel_bins]``, or gives no frame or more than
                the position table holds.
        """
        cfg = self.cfg
        mel = np.asarray(mel, dtype=np.float32)
        if mel.ndim != 2 or mel.shape[1] != cfg.num_mel_bins or mel.shape[0] < 1:
            raise AudioparityError(f"mel_features has shape {list(mel.shape)}; expected "
                                   f"[T, {cfg.num_mel_bins}] with T >= 1")
        n_frames = (mel.shape[0] - 1) // 2 + 1
        if n_frames > cfg.max_source_positions:
            raise AudioparityError(f"mel_features: {mel.shape[0]} frames give {n_frames} encoder "
                                   f"frames; max_source_positions is "
                                   f"{cfg.max_source_positions}")
        w = self.weights
        with self.runtime.graph() as g:
            x = conv_stack(g.ctx, w, g.input(Names.MEL_FEATURES, mel))
            g.output(Names.CONV_OUT, x, ndim=2)
            x = add_positions(g.ctx, w, x)
            for i in range(cfg.encoder_layers):
                x = encoder_layer(g.ctx, w, i, cfg, x)
                g.output(Names.LAYER.at(i), x, ndim=2)
            g.output(Names.ENC_OUT, final_layer_norm(g.ctx, w, x), ndim=2)
            return g.compute()

    def layers_isolated(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Every layer alone on the taps that feed it (e.g. the reference's), in one graph.

        Args:
            inputs: ``[conv_out, layer_0, ..., layer_{N-2}]``, each ``[T', D]``: layer 0 gets
                ``conv_out`` plus ``embed_positions`` (added in the graph, :func:`add_positions`),
                layer i > 0 the output of layer i-1.

        Returns:
            one ``[T', D]`` float32 array per layer.

        Raises:
            AudioparityError: not one input per layer, or an input not ``[T', D]``.
        """
        cfg = self.cfg
        if len(inputs) != cfg.encoder_layers:
            raise AudioparityError(f"{len(inputs)} layer inputs for {cfg.encoder_layers} layers")
        arrays = [np.asarray(x, dtype=np.float32) for x in inputs]
        for index, x in enumerate(arrays):
            if x.ndim != 2 or x.shape[1] != cfg.d_model or not (
                    1 <= x.shape[0] <= cfg.max_source_positions):
                raise AudioparityError(f"layer {index}: input {list(x.shape)}; expected "
                                       f"[T, {cfg.d_model}] with 1 <= T <= "
                                       f"{cfg.max_source_positions}")
        w = self.weights
        with self.runtime.graph() as g:
            for index, x in enumerate(arrays):
                h = g.input(f"input_{index}", x)
                if index == 0:
                    h = add_positions(g.ctx, w, h)
                g.output(Names.LAYER.at(index), encoder_layer(g.ctx, w, index, cfg, h),
                         ndim=2)
            outs = g.compute()
        return [outs[Names.LAYER.at(index)] for index in range(cfg.encoder_layers)]
