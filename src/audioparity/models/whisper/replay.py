"""Reference-side replay of a Whisper candidate: transformers' encoder layers run each on the
candidate's own input to it, so a port that cannot be fed the reference's activations (a
third-party binary) is still localised layer by layer (docs/candidates.md, "Replay").

``layer_0_replayed`` is ``encoder.layers[0]`` on the candidate's ``conv_out`` plus
``embed_positions`` (what ``WhisperEncoder.forward`` adds); ``layer_{i}_replayed`` is
``encoder.layers[i]`` on the candidate's ``layer_{i-1}``. The compare measures the candidate's
``layer_{i}`` against it: the error of that layer alone.
"""

from __future__ import annotations

import numpy as np

from audioparity.contract.family import Case, Outputs, Phase, Skipped
from audioparity.dumping.artifacts import Dump
from audioparity.models.whisper.spec import Names


def stages(loaded, case: Case, candidate: Dump) -> Outputs:
    """The replayed forms of one case (module notes), a phase each: ``layer_{i}_replayed``
    ``[T', D]``; each layer whose input the candidate lacks, or has in another shape than
    ``[T', D]``, is :class:`Skipped` with why."""
    import torch

    config = case.config
    encoder = loaded.model.model.encoder
    shape = (config.n_frames, config.encoder.d_model)
    for index, layer in enumerate(encoder.layers):
        source = Names.CONV_OUT if index == 0 else Names.LAYER.at(index - 1)
        name = Names.LAYER_REPLAYED.at(index)
        if not candidate.has(source):
            yield Skipped(name, f"the candidate dump has no {source}")
            continue
        given = candidate.tensor(source)
        if given.shape != shape:
            yield Skipped(name, f"the candidate's {source} is {list(given.shape)}; the layer's "
                                f"input is {list(shape)}")
            continue
        yield Phase(name)
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(given))[None]
            if index == 0:
                x = x + encoder.embed_positions.weight[: shape[0]]
            yield name, layer(x, attention_mask=None)[0].numpy()
