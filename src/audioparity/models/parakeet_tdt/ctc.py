"""The CTC decoder of Parakeet-CTC and of the hybrid Parakeet-TDT-CTC in ggml (NeMo
``ConvASRDecoder``, ``nemo/collections/asr/modules/conv_asr.py``).

:func:`conv_asr_decoder` mirrors ``ConvASRDecoder.forward``: ``decoder_layers`` (one 1x1
``Conv1d`` ``D -> V+1``, its kernel squeezed to a matrix by :mod:`.layout`) then
``log_softmax`` over the classes (:func:`log_softmax`). :class:`CtcDecoder` runs it on an encoder
output and decodes greedily (:func:`~.greedy.greedy_ctc`). Shapes are NeMo's, batch dropped; a
``[T, V+1]`` array is a ggml tensor with ``ne = [V+1, T]``.
"""

from __future__ import annotations

import ggml
import numpy as np

from audioparity.ggml import Runtime, Weights
from audioparity.ggml.ops import linear
from audioparity.models.parakeet_tdt.config import ParakeetTDTConfig
from audioparity.models.parakeet_tdt.greedy import CtcPath, greedy_ctc
from audioparity.models.parakeet_tdt.spec import Names


def log_softmax(ctx, x):
    """``torch.nn.functional.log_softmax`` over the last axis of x ``[T, C]`` (ne ``[C, T]``),
    computed stably: ``x - m - log(sum(exp(x - m)))`` with ``m`` the row maximum (a max pool
    over the whole row), so a class far below the best keeps its finite log-probability where
    ``log(softmax(x))`` would underflow to ``-inf``."""
    classes = x.contents.ne[0]
    shifted = ggml.ggml_sub(ctx, x, ggml.ggml_pool_1d(ctx, x, ggml.GGML_OP_POOL_MAX,
                                                      classes, classes, 0))
    total = ggml.ggml_sum_rows(ctx, ggml.ggml_exp(ctx, shifted))  # ne [1, T]
    return ggml.ggml_sub(ctx, shifted, ggml.ggml_log(ctx, total))


def conv_asr_decoder(ctx, weights: Weights, prefix: str, enc):
    """``ConvASRDecoder.forward`` (temperature 1, no adapters): ``log_softmax`` of the 1x1
    conv ``{prefix}.decoder_layers.0``.

    Args:
        enc: encoder output ``[T, D]`` (ggml ``ne [D, T]``).

    Returns:
        Log-probabilities ``[T, V+1]`` (ggml ``ne [V+1, T]``), the blank last.
    """
    return log_softmax(ctx, linear(ctx, weights, f"{prefix}.decoder_layers.0", enc))


class CtcDecoder:
    """The ggml CTC decoder of one model.

    Args:
        runtime: the ggml runtime holding ``weights``.
        weights: uploaded weights with NeMo names (``{decoder,ctc_decoder}.decoder_layers.0.*``).
        config: the model config (its ``ctc`` part names the module).
    """

    def __init__(self, runtime: Runtime, weights: Weights, config: ParakeetTDTConfig) -> None:
        self.runtime = runtime
        self.weights = weights
        self.config = config

    def log_probs(self, enc_out: np.ndarray) -> np.ndarray:
        """:func:`conv_asr_decoder` of every frame: ``[T', D]`` -> ``[T', V+1]`` float32."""
        with self.runtime.graph() as graph:
            enc = graph.input(Names.ENC_OUT, np.ascontiguousarray(enc_out, dtype=np.float32))
            graph.output(Names.CTC_LOGITS, conv_asr_decoder(graph.ctx, self.weights,
                                                            self.config.ctc.prefix, enc),
                         ndim=2)
            return graph.compute()[Names.CTC_LOGITS]

    def greedy(self, enc_out: np.ndarray) -> tuple[np.ndarray, CtcPath]:
        """The log-probabilities of ``enc_out [T', D]`` and their greedy CTC decode
        (:func:`~.greedy.greedy_ctc`)."""
        log_probs = self.log_probs(enc_out)
        return log_probs, greedy_ctc(log_probs, self.config.blank_id)
