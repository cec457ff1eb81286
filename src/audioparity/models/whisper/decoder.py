"""The Whisper decoder as ggml graphs, block by block as in transformers, with a KV cache.

Read beside ``transformers.models.whisper.modeling_whisper``: ``WhisperDecoder.forward`` is
:func:`embed` (``embed_tokens(input_ids) + embed_positions`` at the cache's length; no
``embed_scale``, which transformers computes and never applies), the layers, and the final
:func:`final_layer_norm`; :func:`decoder_layer` is ``WhisperDecoderLayer`` (pre-norm:
``self_attn_layer_norm`` -> :func:`self_attention` (causal) -> residual;
``encoder_attn_layer_norm`` -> :func:`cross_attention` -> residual; ``final_layer_norm`` ->
``fc1`` -> GELU -> ``fc2`` -> residual); :func:`logits` is ``WhisperForConditionalGeneration``'s
``proj_out``, tied to ``embed_tokens``. Both attentions are ``WhisperAttention`` with
``eager_attention_forward`` (:func:`~.encoder.attention`). Weight names are ``WhisperModel``'s
own (``decoder.*``, :mod:`.checkpoint`); ``embed_tokens`` is stored like the other matrices (the
cell's weight type), as whisper.cpp stores it: it is read as rows and multiplied as ``proj_out``.

The caches, float32, in one :class:`~audioparity.ggml.State` buffer, as transformers'
``EncoderDecoderCache``: per layer, the self-attention's keys and values of every position so
far (``[max_target_positions, D]``, rows written as the tokens are run), and the
cross-attention's keys and values of the encoder output (``[T', D]``, computed once by
:meth:`Decoder.encoder_output`). A write is a ``ggml_cpy`` into rows of the cache, expanded into
the graph before the attention that reads them (:meth:`~audioparity.ggml.Graph.expand`).

Shapes in docstrings are transformers', batch dropped: ``[S, D]`` is token-major; ggml's ``ne``
is the reverse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ggml
import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.ggml import Graph, GraphCache, Runtime, State, Weights
from audioparity.ggml.ops import layer_norm, linear
from audioparity.models.whisper.config import LAYER_NORM_EPS, WhisperModelConfig
from audioparity.models.whisper.decoding import Decode, greedy
from audioparity.models.whisper.encoder import attention, gelu
from audioparity.models.whisper.spec import Names

F32 = ggml.GGML_TYPE_F32


def causal_mask(start: int, n: int) -> np.ndarray:
    """The additive mask of ``n`` tokens at positions ``start..start+n-1`` over the
    ``start+n`` positions so far ``[n, start+n]`` float32: 0 where the key's position is at most
    the query's, ``-inf`` after (``create_causal_mask``)."""
    keys = np.arange(start + n)[None, :]
    queries = start + np.arange(n)[:, None]
    return np.where(keys <= queries, 0.0, -np.inf).astype(np.float32)


class Caches:
    """The decoder's float32 caches (module notes), named ``self.{k,v}.{layer}``
    (``[max_target_positions, D]``) and ``cross.{k,v}.{layer}`` (``[T', D]``)."""

    def __init__(self, runtime: Runtime, config: WhisperModelConfig) -> None:
        d, layers = config.encoder.d_model, config.n_decoder_layers
        self.d = d
        self.tensors: State = runtime.state({
            **{f"self.{kind}.{i}": ((config.decoder.max_target_positions, d), "f32")
               for i in range(layers) for kind in "kv"},
            **{f"cross.{kind}.{i}": ((config.n_frames, d), "f32")
               for i in range(layers) for kind in "kv"},
        })

    def rows(self, ctx, name: str, start: int, n: int):
        """View of rows ``start..start+n-1`` of cache ``name`` (ne ``[D, n]``)."""
        tensor = self.tensors[name]
        row = ggml.ggml_row_size(F32, self.d)
        return ggml.ggml_view_2d(ctx, tensor, self.d, n, row, start * row)

    def store(self, g: Graph, name: str, current, start: int):
        """Write ``current`` ``[n, D]`` into rows ``start..start+n-1`` of cache ``name``,
        expanded into ``g`` now so that it runs before what reads them."""
        n = current.contents.ne[1]
        g.expand(ggml.ggml_cpy(g.ctx, current, self.rows(g.ctx, name, start, n)))

    def read(self, ctx, name: str, n: int):
        """Rows ``0..n-1`` of cache ``name`` ``[n, D]``: every position so far."""
        return self.rows(ctx, name, 0, n)


@dataclass(frozen=True)
class Window:
    """The tokens one graph computes, as every layer sees them (transformers' past key values,
    cache position and attention mask): ``n`` tokens at positions ``start..start+n-1``, after
    the ``start`` tokens the caches hold (``n`` is read from the hidden states).

    Attributes:
        caches: the layers' caches; the self-attention's are written at rows
            ``start..start+n-1``.
        start: the first token's position.
        mask: graph input ``[n, start+n]`` (ne ``[start+n, n]``), :func:`causal_mask`; None for
            one token, which sees every position so far.
    """

    caches: Caches
    start: int
    mask: Any


def embed(ctx, w: Weights, ids, start: int):
    """``embed_tokens(input_ids) + embed_positions`` of ``n`` tokens at positions
    ``start..start+n-1`` (``WhisperPositionalEmbedding`` at ``cache_length = start``).

    Args:
        ids: int32 ``[n]``.

    Returns:
        ``[n, D]``.
    """
    tokens = ggml.ggml_get_rows(ctx, w["decoder.embed_tokens.weight"], ids)  # ne [D, n]
    table = w["decoder.embed_positions.weight"]  # ne [D, max_target_positions]
    n = ids.contents.ne[0]
    rows = ggml.ggml_view_2d(ctx, table, table.contents.ne[0], n, table.contents.nb[1],
                             start * table.contents.nb[1])
    return ggml.ggml_add(ctx, tokens, rows)


def self_attention(g: Graph, w: Weights, config: WhisperModelConfig, layer: int, x,
                   window: Window):
    """``WhisperAttention`` as the decoder's causal self-attention
    (``decoder.layers.{layer}.self_attn``): ``q = q_proj(x) * head_dim ** -0.5``,
    ``k = k_proj(x)`` (no bias) and ``v = v_proj(x)`` appended to the layer's cache at
    ``window.start``, attention over every cached position under ``window.mask``, ``out_proj``.

    Args:
        x: ``[n, D]`` (ne ``[D, n]``, after ``self_attn_layer_norm``), the tokens of
            ``window``.

    Returns:
        ``[n, D]``.
    """
    ctx, n_head = g.ctx, config.decoder.decoder_attention_heads
    caches, start, mask = window.caches, window.start, window.mask
    prefix = f"decoder.layers.{layer}.self_attn."
    n = x.contents.ne[1]
    q = ggml.ggml_scale(ctx, linear(ctx, w, prefix + "q_proj", x),
                        (config.encoder.d_model // n_head) ** -0.5)
    caches.store(g, f"self.k.{layer}", linear(ctx, w, prefix + "k_proj", x), start)
    caches.store(g, f"self.v.{layer}", linear(ctx, w, prefix + "v_proj", x), start)
    out = attention(ctx, n_head, q, caches.read(ctx, f"self.k.{layer}", start + n),
                    caches.read(ctx, f"self.v.{layer}", start + n), mask)
    return linear(ctx, w, prefix + "out_proj", out)


def cross_attention(ctx, w: Weights, config: WhisperModelConfig, layer: int, x,
                    caches: Caches):
    """``WhisperAttention`` as the decoder's cross-attention
    (``decoder.layers.{layer}.encoder_attn``, ``key_value_states`` the encoder output):
    ``q = q_proj(x) * head_dim ** -0.5``; the keys ``k_proj(enc_out)`` and values
    ``v_proj(enc_out)`` from the layer's cross cache (:meth:`Decoder.encoder_output`); no mask;
    ``out_proj``.

    Args:
        x: ``[n, D]`` (ne ``[D, n]``, after ``encoder_attn_layer_norm``).

    Returns:
        ``[n, D]``.
    """
    n_head = config.decoder.decoder_attention_heads
    prefix = f"decoder.layers.{layer}.encoder_attn."
    q = ggml.ggml_scale(ctx, linear(ctx, w, prefix + "q_proj", x),
                        (config.encoder.d_model // n_head) ** -0.5)
    frames = config.n_frames
    out = attention(ctx, n_head, q, caches.read(ctx, f"cross.k.{layer}", frames),
                    caches.read(ctx, f"cross.v.{layer}", frames))
    return linear(ctx, w, prefix + "out_proj", out)


def decoder_layer(g: Graph, w: Weights, index: int, config: WhisperModelConfig, x,
                  window: Window):
    """``WhisperDecoderLayer`` ``decoder.layers.{index}`` (pre-norm):
    ``x += self_attn(self_attn_layer_norm(x))``, ``x += encoder_attn(encoder_attn_layer_norm(x))``,
    then ``x += fc2(gelu(fc1(final_layer_norm(x))))``.

    Args:
        x: ``[n, D]`` (ne ``[D, n]``), the tokens of ``window``.

    Returns:
        ``[n, D]``.
    """
    ctx, p = g.ctx, f"decoder.layers.{index}."

    def norm(name, t):
        return layer_norm(ctx, t, w[f"{p}{name}.weight"], w[f"{p}{name}.bias"], LAYER_NORM_EPS)

    x = ggml.ggml_add(ctx, x, self_attention(g, w, config, index,
                                             norm("self_attn_layer_norm", x), window))
    x = ggml.ggml_add(ctx, x, cross_attention(ctx, w, config, index,
                                              norm("encoder_attn_layer_norm", x), window.caches))
    h = gelu(ctx, linear(ctx, w, p + "fc1", norm("final_layer_norm", x)))
    return ggml.ggml_add(ctx, x, linear(ctx, w, p + "fc2", h))


def final_layer_norm(ctx, w: Weights, x):
    """``WhisperDecoder.layer_norm`` after the last layer: x ``[n, D]`` -> ``[n, D]``."""
    return layer_norm(ctx, x, w["decoder.layer_norm.weight"], w["decoder.layer_norm.bias"],
                      LAYER_NORM_EPS)


def logits(ctx, w: Weights, x):
    """``proj_out`` (no bias), tied to ``embed_tokens``: x ``[n, D]`` -> ``[n, V]``."""
    return ggml.ggml_mul_mat(ctx, w["decoder.embed_tokens.weight"], x)


class Decoder:
    """transformers' ``WhisperDecoder`` and ``proj_out`` on a ggml runtime, with its caches.

    Args:
        weights: uploaded weights (:func:`audioparity.dumping.driver.upload_weights`),
            ``WhisperModel`` names.
        config: the model config.
        runtime: the runtime the weights live on.

    A graph is built once per first position and token count and kept
    (:class:`~audioparity.ggml.GraphCache`), since its cache views depend on them: the
    teacher-forced pass, the decode and the replay run the same positions.

    Example::

        decoder = Decoder(weights, config, rt)
        decoder.encoder_output(enc_out)                  # [1500, D]: the cross caches
        taps = decoder.forward([50257, 50362, 843], 0)   # decoder_layer_{i} [3, D], logits [3, V]
        taps = decoder.teacher_forced(tokens, 2)         # the same, one cached step a token
        decode = decoder.greedy([50257, 50362])          # ids, margins (decoding.greedy)
    """

    def __init__(self, weights: Weights, config: WhisperModelConfig, runtime: Runtime) -> None:
        self.weights = weights
        self.config = config
        self.runtime = runtime
        self.caches = Caches(runtime, config)
        self.has_encoder_output = False
        self._graphs = GraphCache(runtime)

    def encoder_output(self, enc_out: np.ndarray) -> None:
        """Every layer's cross-attention keys ``k_proj(enc_out)`` and values
        ``v_proj(enc_out)`` into its cross cache, once per encoder output (as transformers
        computes them at the first step and reuses them).

        Raises:
            AudioparityError: ``enc_out`` is not ``[T', D]``.
        """
        enc_out = np.asarray(enc_out, dtype=np.float32)
        expected = (self.config.n_frames, self.config.encoder.d_model)
        if enc_out.shape != expected:
            raise AudioparityError(f"enc_out has shape {list(enc_out.shape)}; the decoder takes "
                                   f"{list(expected)}")
        def build(g: Graph, t: dict) -> None:
            x = t[Names.ENC_OUT]
            for i in range(self.config.n_decoder_layers):
                p = f"decoder.layers.{i}.encoder_attn."
                self.caches.store(g, f"cross.k.{i}", linear(g.ctx, self.weights, p + "k_proj", x),
                                  0)
                self.caches.store(g, f"cross.v.{i}", linear(g.ctx, self.weights, p + "v_proj", x),
                                  0)

        self._graphs.compute(Names.ENC_OUT, {Names.ENC_OUT: enc_out}, build)
        self.has_encoder_output = True

    def _check(self, ids: Sequence[int], start: int) -> np.ndarray:
        config = self.config
        if not self.has_encoder_output:
            raise AudioparityError("the decoder has no encoder output (encoder_output first)")
        array = np.asarray(ids, dtype=np.int32)
        vocab = config.decoder.vocab_size
        if array.ndim != 1 or not len(array) or array.min() < 0 or array.max() >= vocab:
            raise AudioparityError(f"decoder input ids {array.tolist()[:8]}: expected a "
                                   f"non-empty list of ids in [0, {vocab})")
        if start + len(array) > config.decoder.max_target_positions:
            raise AudioparityError(f"{start} cached + {len(array)} new tokens exceed "
                                   f"max_target_positions={config.decoder.max_target_positions}")
        return array

    def forward(self, ids: Sequence[int], start: int) -> dict[str, np.ndarray]:
        """The tokens ``ids`` at positions ``start..start+n-1``, after the ``start`` tokens the
        caches hold (what earlier calls ran), in one graph.

        Returns:
            ``decoder_layer_{i}`` ``[n, D]`` for every layer and ``logits`` ``[n, V]``
            (``proj_out`` of the final ``layer_norm``), float32.

        Raises:
            AudioparityError: no encoder output yet, an id outside the vocabulary, or more
                positions than ``max_target_positions``.
        """
        array = self._check(ids, start)
        n, w = len(array), self.weights
        inputs = {"ids": array}
        if n > 1:
            inputs["mask"] = causal_mask(start, n)

        def build(g: Graph, t: dict) -> None:
            x = embed(g.ctx, w, t["ids"], start)
            window = Window(self.caches, start, t.get("mask"))
            for i in range(self.config.n_decoder_layers):
                x = decoder_layer(g, w, i, self.config, x, window)
                g.output(Names.DECODER_LAYER.at(i), x, ndim=2)
            g.output("logits", logits(g.ctx, w, final_layer_norm(g.ctx, w, x)), ndim=2)

        return self._graphs.compute(start, inputs, build)

    def teacher_forced(self, tokens: Sequence[int], prefill: int) -> dict[str, np.ndarray]:
        """The decoder over ``tokens`` as a decode runs it: the first ``prefill`` (the prompt)
        in one graph, then one graph per token after the cached ones, the rows of every step
        stacked; so the teacher-forced stages go through the KV cache's path.

        Returns:
            ``decoder_layer_{i}`` ``[S, D]`` and ``logits`` ``[S, V]``, float32.

        Raises:
            AudioparityError: as :meth:`forward`, or ``prefill`` not in ``1 .. S``.
        """
        if not 1 <= prefill <= len(tokens):
            raise AudioparityError(f"prefill of {prefill} tokens of {len(tokens)}")
        steps = [self.forward(list(tokens[:prefill]), 0)]
        steps += [self.forward([token], position) for position, token in
                  enumerate(tokens[prefill:], start=prefill)]
        return {name: np.concatenate([step[name] for step in steps]) for name in steps[0]}

    def layers_isolated(self, ids: Sequence[int], inputs: Sequence[np.ndarray]
                        ) -> list[np.ndarray]:
        """Every layer alone on the taps that feed it (e.g. the reference's), from position 0,
        over the cross caches of the last :meth:`encoder_output`, in one graph.

        Args:
            ids: the ``S`` tokens; layer 0's input is their :func:`embed`.
            inputs: ``[decoder_layer_0, ..., decoder_layer_{N-2}]``, each ``[S, D]``: the input
                of layers 1 .. N-1.

        Returns:
            one ``[S, D]`` float32 array per layer.

        Raises:
            AudioparityError: as :meth:`forward`, not one input per layer but the first, or an
                input not ``[S, D]``.
        """
        array = self._check(ids, 0)
        n, w, layers = len(array), self.weights, self.config.n_decoder_layers
        if len(inputs) != layers - 1:
            raise AudioparityError(f"{len(inputs)} decoder layer inputs for layers 1 .. "
                                   f"{layers - 1}")
        arrays = [np.asarray(x, dtype=np.float32) for x in inputs]
        for index, x in enumerate(arrays, start=1):
            if x.shape != (n, self.config.encoder.d_model):
                raise AudioparityError(f"decoder layer {index}: input {list(x.shape)}; expected "
                                       f"[{n}, {self.config.encoder.d_model}]")
        with self.runtime.graph() as g:
            mask = g.input("mask", causal_mask(0, n)) if n > 1 else None
            window = Window(self.caches, 0, mask)
            for index in range(layers):
                h = (embed(g.ctx, w, g.input("ids", array), 0) if index == 0
                     else g.input(f"input_{index}", arrays[index - 1]))
                g.output(Names.DECODER_LAYER.at(index),
                         decoder_layer(g, w, index, self.config, h, window),
                         ndim=2)
            outs = g.compute()
        return [outs[Names.DECODER_LAYER.at(index)] for index in range(layers)]

    def greedy(self, prompt: Sequence[int]) -> Decode:
        """The greedy decode (:func:`~.decoding.greedy`) of the last :meth:`encoder_output`:
        the prompt run in one graph, then one graph per token, each after the cached ones."""
        position = 0

        def forward(ids: list[int]) -> np.ndarray:
            nonlocal position
            out = self.forward(ids, position)["logits"]
            position += len(ids)
            return out[-1]

        return greedy(self.config, prompt, forward)
