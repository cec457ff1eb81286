"""The Parakeet-TDT decoder in ggml: prediction network and joint, driven from the host.

Blocks, named like NeMo's and in its order (``nemo/collections/asr/modules/rnnt.py``):

- :func:`prediction_network` mirrors ``RNNTDecoder.predict``: ``prediction.embed`` (an
  ``nn.Embedding`` of V+1 rows whose blank row, ``padding_idx``, is zero) then
  ``prediction.dec_rnn`` (a stacked ``torch.nn.LSTM``, one :func:`lstm_cell` per layer, gate
  order i, f, g, o as torch stores them).
- :func:`project_encoder`, :func:`project_prednet`, :func:`joint_after_projection` mirror
  ``RNNTJoint``'s methods of those names; :func:`joint` is ``RNNTJoint.joint``:
  ``act(enc(f) + pred(g)) @ W_out^T + b_out`` with ``W_out`` = ``joint_net.2``.

:class:`TdtDecoder` runs them for the greedy rules of :mod:`.greedy` (free running) or along a
given path (teacher forced).

ggml layout: ``ne`` is the numpy shape reversed; a numpy ``[N, H]`` array is a ggml tensor with
``ne = [H, N]``. The host side (:class:`TdtDecoder`) speaks numpy shapes only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import ggml
import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.ggml import Graph, GraphCache, Runtime, Weights
from audioparity.ggml.ops import linear
from audioparity.models.parakeet_tdt.config import ParakeetTDTConfig
from audioparity.models.parakeet_tdt.greedy import GreedyPath, greedy_tdt
from audioparity.models.parakeet_tdt.settings import JOINT_ACTIVATIONS
from audioparity.models.parakeet_tdt.spec import Names

EMBED = "decoder.prediction.embed.weight"
JOINT_ENC = "joint.enc"
JOINT_PRED = "joint.pred"
JOINT_OUT = "joint.joint_net.2"

_ACTIVATIONS = {name: getattr(ggml, f"ggml_{name}") for name in JOINT_ACTIVATIONS}


class LstmWeights(NamedTuple):
    """One ``torch.nn.LSTM`` layer's parameters, in the order of its ``_flat_weights`` (and of
    ``torch.lstm_cell``'s arguments after ``hx``): ``w_ih`` ``[4H, H_in]`` (ggml ``ne [H_in,
    4H]``), ``w_hh`` ``[4H, H]``, ``b_ih`` and ``b_hh`` ``[4H]``, gate rows i, f, g, o."""

    w_ih: Any
    w_hh: Any
    b_ih: Any
    b_hh: Any

    @classmethod
    def of(cls, weights: Weights, layer: int) -> LstmWeights:
        """Layer ``layer`` of the prediction network's ``dec_rnn``: NeMo's
        ``decoder.prediction.dec_rnn.lstm.{weight_ih,weight_hh,bias_ih,bias_hh}_l{layer}``."""
        p = "decoder.prediction.dec_rnn.lstm."
        return cls(*(weights[f"{p}{kind}_l{layer}"]
                     for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")))


def lstm_cell(ctx, x, hx: tuple, params: LstmWeights):
    """One step of one ``torch.nn.LSTM`` layer: ``torch.lstm_cell(x, hx, *params)``.

    ``gates = (W_ih x + b_ih) + (W_hh h + b_hh)`` split as i, f, g, o;
    ``c' = sigmoid(f) * c + sigmoid(i) * tanh(g)``, ``h' = sigmoid(o) * tanh(c')``.

    Args:
        x: input, ggml ``ne [H_in]``.
        hx: the state ``(h, c)``, each ``ne [H]`` (H, the hidden size, is read off ``h``).
        params: the layer's weights (:class:`LstmWeights`).

    Returns:
        ``(h', c')``, each ``ne [H]``.
    """
    h, c = hx
    hidden = h.contents.ne[0]
    gates = ggml.ggml_add(
        ctx,
        ggml.ggml_add(ctx, ggml.ggml_mul_mat(ctx, params.w_ih, x), params.b_ih),
        ggml.ggml_add(ctx, ggml.ggml_mul_mat(ctx, params.w_hh, h), params.b_hh),
    )
    size = ggml.ggml_element_size(gates) * hidden

    def gate(k: int):
        return ggml.ggml_view_1d(ctx, gates, hidden, k * size)

    i = ggml.ggml_sigmoid(ctx, gate(0))
    f = ggml.ggml_sigmoid(ctx, gate(1))
    g = ggml.ggml_tanh(ctx, gate(2))
    o = ggml.ggml_sigmoid(ctx, gate(3))
    c_new = ggml.ggml_add(ctx, ggml.ggml_mul(ctx, f, c), ggml.ggml_mul(ctx, i, g))
    h_new = ggml.ggml_mul(ctx, o, ggml.ggml_tanh(ctx, c_new))
    return h_new, c_new


def prediction_network(ctx, weights: Weights, config: ParakeetTDTConfig, label, h: list, c: list):
    """``RNNTDecoder.predict(label, (h, c), add_sos=False)`` for one label.

    Args:
        label: int32 ``ne [1]``, a token id or the blank (SOS; its embedding row is zero).
        h, c: per layer, ggml ``ne [H]``.

    Returns:
        ``(g, h', c')``: the last layer's output ``ne [H]`` and the new per-layer states.
    """
    hidden = config.decoder.pred_hidden
    x = ggml.ggml_reshape_1d(ctx, ggml.ggml_get_rows(ctx, weights[EMBED], label), hidden)
    h_new, c_new = [], []
    for layer in range(config.decoder.pred_rnn_layers):
        x, cell = lstm_cell(ctx, x, (h[layer], c[layer]), LstmWeights.of(weights, layer))
        h_new.append(x)
        c_new.append(cell)
    return x, h_new, c_new


def project_encoder(ctx, weights: Weights, enc):
    """``RNNTJoint.project_encoder``: ``joint.enc`` Linear, ``[N, D]`` -> ``[N, J]``
    (ggml ``ne [D, N]`` -> ``ne [J, N]``)."""
    return linear(ctx, weights, JOINT_ENC, enc)


def project_prednet(ctx, weights: Weights, pred):
    """``RNNTJoint.project_prednet``: ``joint.pred`` Linear, ``[N, H]`` -> ``[N, J]``."""
    return linear(ctx, weights, JOINT_PRED, pred)


def joint_after_projection(ctx, weights: Weights, config: ParakeetTDTConfig, f, g):
    """``RNNTJoint.joint_after_projection`` for aligned rows: ``joint_net(f + g)`` =
    ``act(f + g) @ W_out^T + b_out`` (dropout is the identity in eval).

    Args:
        f, g: projected encoder and prediction rows, ggml ``ne [J, N]`` each.

    Returns:
        Raw logits ``ne [V+1+n_durations, N]`` (no log-softmax).
    """
    activation = _ACTIVATIONS.get(config.joint.activation)
    if activation is None:
        raise AudioparityError(f"joint activation {config.joint.activation!r}: expected one of "
                               f"{', '.join(_ACTIVATIONS)}")
    return linear(ctx, weights, JOINT_OUT, activation(ctx, ggml.ggml_add(ctx, f, g)))


def joint(ctx, weights: Weights, config: ParakeetTDTConfig, enc, pred):
    """``RNNTJoint.joint`` for aligned rows (row n pairs encoder frame n with prediction row n).

    Args:
        enc: encoder rows ``[N, D]`` (ggml ``ne [D, N]``); pred: prediction rows ``[N, H]``.

    Returns:
        Raw logits ``[N, V+1+n_durations]`` (ggml ``ne [V+1+n_durations, N]``).
    """
    return joint_after_projection(ctx, weights, config, project_encoder(ctx, weights, enc),
                                  project_prednet(ctx, weights, pred))


# --------------------------------------------------------------------------------------------
# Host driver


@dataclass(frozen=True)
class LstmState:
    """Prediction-network state: ``h`` and ``c``, each ``[num_layers, H]`` float32."""

    h: np.ndarray
    c: np.ndarray

    def stacked(self) -> np.ndarray:
        """``[num_layers, 2, H]``: h then c per layer (the ``lstm_state_0`` layout)."""
        return np.stack([self.h, self.c], axis=1)


class TdtDecoder:
    """The ggml prediction network and joint of one model, driven from the host.

    Graphs are built once per shape and reused (:class:`GraphCache`); weights are the uploaded
    :class:`Weights` (any storage type). Use as a context manager, or call :meth:`close`.

    Args:
        runtime: the ggml runtime holding ``weights``.
        weights: uploaded weights with NeMo names (``decoder.prediction.*``, ``joint.*``).
        config: the model config.
    """

    def __init__(self, runtime: Runtime, weights: Weights, config: ParakeetTDTConfig) -> None:
        self.runtime = runtime
        self.weights = weights
        self.config = config
        self._graphs = GraphCache(runtime)

    def close(self) -> None:
        """Free the cached graphs."""
        self._graphs.close()

    def __enter__(self) -> TdtDecoder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def zero_state(self) -> LstmState:
        """The all-zero LSTM state ``[num_layers, H]`` twice (NeMo's initial state)."""
        shape = (self.config.decoder.pred_rnn_layers, self.config.decoder.pred_hidden)
        return LstmState(np.zeros(shape, np.float32), np.zeros(shape, np.float32))

    def predict(self, label: int, state: LstmState | None) -> tuple[np.ndarray, np.ndarray,
                                                                     LstmState]:
        """One :func:`prediction_network` step plus :func:`project_prednet`.

        Args:
            label: token id in ``[0, V]`` (V, the blank, is the SOS label).
            state: the state before the step (None: zero state).

        Returns:
            ``(g [H], projected g [J], state after the step)``.

        Raises:
            AudioparityError: a label outside the embedding.
        """
        if not 0 <= label <= self.config.blank_id:
            raise AudioparityError(f"label {label} outside the embedding [0, "
                                   f"{self.config.blank_id}]")
        state = state if state is not None else self.zero_state()
        layers = self.config.decoder.pred_rnn_layers
        inputs = {"label": np.array([label], np.int32)}
        for layer in range(layers):
            inputs[f"h{layer}"] = state.h[layer]
            inputs[f"c{layer}"] = state.c[layer]

        def build(graph: Graph, t: dict) -> None:
            g, h, c = prediction_network(
                graph.ctx, self.weights, self.config, t["label"],
                [t[f"h{i}"] for i in range(layers)], [t[f"c{i}"] for i in range(layers)],
            )
            graph.output("g", g, ndim=1)
            graph.output("g_proj", project_prednet(graph.ctx, self.weights, g), ndim=1)
            for layer in range(layers):
                graph.output(f"h{layer}", h[layer], ndim=1)
                graph.output(f"c{layer}", c[layer], ndim=1)

        out = self._graphs.compute("predict", inputs, build)
        new_state = LstmState(np.stack([out[f"h{i}"] for i in range(layers)]),
                              np.stack([out[f"c{i}"] for i in range(layers)]))
        return out["g"], out["g_proj"], new_state

    def encoder_projection(self, enc_out: np.ndarray) -> np.ndarray:
        """:func:`project_encoder` of every frame, ``[T', D]`` -> ``[T', J]`` (NeMo projects the
        encoder output once before decoding)."""
        with self.runtime.graph() as graph:
            enc = graph.input(Names.ENC_OUT, np.ascontiguousarray(enc_out, dtype=np.float32))
            graph.output("f", project_encoder(graph.ctx, self.weights, enc), ndim=2)
            return graph.compute()["f"]

    def joint_step(self, f: np.ndarray, g: np.ndarray) -> np.ndarray:
        """:func:`joint_after_projection` of one projected encoder row ``f [J]`` and one
        projected prediction row ``g [J]``; returns raw logits ``[V+1+n_durations]``."""
        def build(graph: Graph, t: dict) -> None:
            graph.output("logits", joint_after_projection(graph.ctx, self.weights, self.config,
                                                          t["f"], t["g"]), ndim=1)

        return self._graphs.compute("joint", {"f": f, "g": g}, build)["logits"]

    def greedy(self, enc_out: np.ndarray) -> GreedyPath:
        """Free-running greedy TDT decoding of ``enc_out [T', D]`` (:func:`greedy_tdt`)."""
        projected = self.encoder_projection(enc_out)

        def predict(label: int, state: LstmState | None) -> tuple[np.ndarray, LstmState]:
            _, g_proj, new_state = self.predict(label, state)
            return g_proj, new_state

        return greedy_tdt(
            enc_out.shape[0], lambda t, g: self.joint_step(projected[t], g), predict,
            blank_id=self.config.blank_id, durations=self.config.durations,
            max_symbols=self.config.max_symbols,
        )

    def teacher_forced(self, enc_out: np.ndarray, path: GreedyPath) -> tuple[np.ndarray,
                                                                              np.ndarray]:
        """The joint evaluated along a given path (the reference's), row for row.

        The prediction network is fed the blank/SOS then ``path.ids`` in order; row ``r`` of the
        result is :func:`joint` of ``enc_out[path.row_frames[r]]`` and the prediction output
        after ``path.row_history[r]`` tokens.

        Args:
            enc_out: ``[T', D]`` encoder output: the reference's (``joint_logits``), or the
                port's own (``decode_logits``: the whole pipeline's decode teacher-forced).
            path: the reference path (``reference.tdt_greedy_path`` of its ``joint_logits``).

        Returns:
            ``(joint_logits [steps, V+1+n_durations], lstm_state_0 [num_layers, 2, H])`` where
            ``lstm_state_0`` is the state after the first (SOS) step.

        Raises:
            AudioparityError: the path refers to frames outside ``enc_out`` or has no rows.
        """
        frames = np.asarray(path.row_frames, dtype=np.int64)
        if frames.size == 0 or frames.max() >= enc_out.shape[0] or frames.min() < 0:
            raise AudioparityError(
                f"reference path: {frames.size} rows with frames up to "
                f"{frames.max() if frames.size else None}, enc_out has {enc_out.shape[0]} frames"
            )
        g, _, state = self.predict(self.config.blank_id, None)
        lstm_state_0 = state.stacked()
        outputs = [g]
        for token in path.ids[: max(path.row_history)]:
            g, _, state = self.predict(token, state)
            outputs.append(g)
        pred_rows = np.stack(outputs)[np.asarray(path.row_history)]
        enc_rows = np.ascontiguousarray(enc_out[frames], dtype=np.float32)
        with self.runtime.graph() as graph:
            out = joint(graph.ctx, self.weights, self.config, graph.input("enc", enc_rows),
                        graph.input("pred", pred_rows))
            graph.output("logits", out, ndim=2)
            return graph.compute()["logits"], lstm_state_0
