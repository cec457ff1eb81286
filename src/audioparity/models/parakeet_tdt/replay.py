"""The reference side of a Parakeet-TDT candidate's replay: NeMo runs each block on the
candidate's own input to it, so a port that cannot be fed the reference's activations (a
third-party binary) is still localised block by block (docs/candidates.md, "Replay").

In one NeMo encoder run on the case's audio, forward hooks substitute the candidate's tensors:
its ``mel_features`` for the preprocessor's output, its ``pre_encode`` for ``pre_encode``'s
output (so ``layer_0`` runs on it, after NeMo's own ``pos_enc``), its ``layer_{i-1}`` for
``layers[i]``'s input. What each block computes on the substituted input is its replayed form:
``pre_encode_replayed``, ``layer_{i}_replayed``. NeMo's greedy TDT decoding of the candidate's
``enc_out`` is ``decode_replayed``. The compare then measures the candidate's stage against its
replayed form: the error of that block alone.

:func:`replayed_encoder` runs the encoder so; the NeMo reference's
:func:`~.references.nemo.replay_stages` yields its forms and the decoding's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from audioparity.dumping.artifacts import Dump
from audioparity.models.parakeet_tdt.spec import Names


def _given(candidate: Dump, name: str, shape: tuple[int, ...], skipped: dict[str, str],
           replayed: str) -> np.ndarray | None:
    """The candidate's tensor ``name`` when it has it with ``shape``; else None, and the reason
    ``replayed`` cannot be replayed in ``skipped``."""
    if not candidate.has(name):
        skipped[replayed] = f"the candidate dump has no {name}"
        return None
    array = candidate.tensor(name)
    if array.shape != shape:
        skipped[replayed] = (f"the candidate's {name} is {list(array.shape)}, NeMo's input "
                             f"there is {list(shape)}")
        return None
    return array


class _Substitutions:
    """The forward hooks of :func:`replayed_encoder`: each substitutes the candidate's input
    to a block and records the block's output on it (``replayed``), or why it could not
    (``skipped``).

    Args:
        candidate: the candidate's dump.
        mel_given: the candidate's ``mel_features`` replaced the preprocessor's output (so
            ``pre_encode``'s output is its replayed form).
        skipped: the reasons recorded so far (shared, added to).
    """

    def __init__(self, candidate: Dump, mel_given: bool, skipped: dict[str, str]) -> None:
        self.candidate = candidate
        self.mel_given = mel_given
        self.replayed: dict[str, np.ndarray] = {}
        self.skipped = skipped
        self.frames: list[int] = []

    def on_pre_encode(self, module: Any, inputs: Any, output: Any) -> Any:
        """``pre_encode``'s output recorded, then replaced by the candidate's ``pre_encode``."""
        import torch

        x, lengths = output
        self.frames.append(int(lengths[0]))
        if self.mel_given:
            self.replayed[Names.PRE_ENCODE_REPLAYED] = (
                x[0, : self.frames[0]].float().numpy().copy())
        given = _given(self.candidate, Names.PRE_ENCODE, (self.frames[0], x.shape[2]),
                       self.skipped, Names.LAYER_REPLAYED.at(0))
        if given is None:
            return None
        x = x.clone()
        x[0, : self.frames[0]] = torch.from_numpy(given)
        return x, lengths

    def before_layer(self, index: int) -> Any:
        """The pre-hook of ``layers[index]``: its input ``x`` replaced by the candidate's
        ``layer_{index-1}`` (layer 0's input comes from :meth:`on_pre_encode`)."""
        import torch

        def hook(module: Any, args: Any, kwargs: dict) -> Any:
            if index == 0:
                return None
            x = kwargs["x"]
            given = _given(self.candidate, Names.LAYER.at(index - 1),
                           (self.frames[0], x.shape[2]), self.skipped,
                           Names.LAYER_REPLAYED.at(index))
            if given is None:
                return None
            x = x.clone()
            x[0, : self.frames[0]] = torch.from_numpy(given)
            return args, {**kwargs, "x": x}
        return hook

    def after_layer(self, index: int) -> Any:
        """The hook of ``layers[index]``: its output's valid frames, unless its input was not
        substituted."""
        def hook(module: Any, inputs: Any, output: Any) -> None:
            name = Names.LAYER_REPLAYED.at(index)
            if name not in self.skipped:
                self.replayed[name] = output[0, : self.frames[0]].float().numpy().copy()
        return hook


def replayed_encoder(model: Any, features: Any, length: Any, candidate: Dump
                     ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """NeMo ``model.encoder`` (``ConformerEncoder``) with each block fed the candidate's input
    (module notes).

    Args:
        features, length: the preprocessor's output on the case (``[1, n_mels, T_padded]``,
            ``[1]``).
        candidate: the candidate's dump (``mel_features [T, n_mels]``, ``pre_encode [T', D]``,
            ``layer_{i} [T', D]``; each one it lacks skips the block fed by it).

    Returns:
        ``(replayed, skipped)``: ``pre_encode_replayed`` and ``layer_{i}_replayed`` ``[T', D]``
        (valid frames); for each block not replayed, why.
    """
    import torch

    enc = model.encoder
    skipped: dict[str, str] = {}
    n_frames = int(length[0])
    mel = _given(candidate, Names.MEL_FEATURES, (n_frames, features.shape[1]), skipped,
                 Names.PRE_ENCODE_REPLAYED)
    features = features.clone()
    if mel is not None:
        features[0, :, :n_frames] = torch.from_numpy(mel.T.copy())
    hooks = _Substitutions(candidate, mel is not None, skipped)
    handles = [enc.pre_encode.register_forward_hook(hooks.on_pre_encode)]
    for index, layer in enumerate(enc.layers):
        handles.append(layer.register_forward_pre_hook(hooks.before_layer(index),
                                                       with_kwargs=True))
        handles.append(layer.register_forward_hook(hooks.after_layer(index)))
    try:
        with torch.inference_mode():
            enc(audio_signal=features, length=length)
    finally:
        for handle in handles:
            handle.remove()
    return hooks.replayed, hooks.skipped
