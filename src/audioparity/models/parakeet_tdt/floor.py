"""NeMo against itself on one case: how far its stages after the mel move when its float32
per-feature normalisation is replaced by float64 normalisation of the same log-mel.

On audio band-limited below the model's band (8 kHz telephone speech through a 16 kHz model, a
22.05 kHz model on 16 kHz speech) the top mel bins are near-constant (std about 1e-5), and
normalisation divides their float32 rounding by that std: NeMo's own normalised mel is then off
the exact one by an NMSE of 2e-8 (jfk.wav through 8 kHz) to 4e-4 (the clip through 8 kHz), and
every stage after it carries that error, NeMo's as much as any float32 port's. This module
measures it: the encoder, the joint along NeMo's own greedy path and the CTC decoder run again
on the exact mel, each stage's float32 output measured against that run. The compare raises the
end-to-end bounds to a gain times this floor (``carried_noise``,
:mod:`audioparity.compare.scaling`); the stages fed the reference's own inputs (isolated,
replayed) keep theirs and judge each block alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from audioparity.compare import metrics
from audioparity.models.parakeet_tdt.spec import Names

#: NMSE of NeMo's float32 normalised mel against float64 normalisation of its log-mel beyond
#: which the floor is measured: the mel gate's plain float32 bound, which the end-to-end
#: bounds were measured under. NeMo against float64 here: the clip 2.7e-14, jfk.wav 2.9e-12 (and
#: flat to 30 minutes); band-limited audio 2.1e-8 (jfk.wav through 8 kHz) to 4.3e-4 (the clip).
EXACT_MEL_NMSE = 1.0e-10
#: The metrics of each stage the floor records, those the carried bounds read.
MEASURED = ("nmse", "max_rel", "cosine")


def exact_features(model: Any, samples: np.ndarray, features: Any, length: Any) -> Any:
    """NeMo's preprocessor output with its per-feature normalisation in float64: ``features``
    (``[1, n_mels, T_padded]``, float32, NeMo's own) with its first ``length`` frames replaced
    by ``normalize_batch`` of the un-normalised log-mel in float64, rounded to float32 once.

    Mirrors ``FilterbankFeatures.forward`` (NeMo ``asr/parts/preprocessing/features.py``): the
    log-mel is NeMo's own, its ``normalize`` switched off for that one call.
    """
    import torch
    from nemo.collections.asr.parts.preprocessing.features import normalize_batch

    featurizer = model.preprocessor.featurizer
    normalize, featurizer.normalize = featurizer.normalize, None
    try:
        signal = torch.from_numpy(samples).unsqueeze(0)
        with torch.inference_mode():
            log_mel, _ = model.preprocessor(input_signal=signal,
                                            length=torch.tensor([signal.shape[1]]))
            exact, _, _ = normalize_batch(log_mel.double(), length, normalize)
    finally:
        featurizer.normalize = normalize
    n = int(length[0])
    out = features.clone()
    out[:, :, :n] = exact[:, :, :n].float()
    return out


@dataclass(frozen=True)
class ReferenceRun:
    """The reference's run of one case that :func:`noise_floor` measures against.

    Attributes:
        samples: the case's audio ``[L]`` float32 at the model's rate.
        features, length: NeMo's preprocessor output on them, ``[1, n_mels, T_padded]``
            float32 and ``[1]`` valid frames (:func:`~.references.nemo.preprocessor`).
        outputs: the reference's stages of the case, by name.
    """

    samples: np.ndarray
    features: Any
    length: Any
    outputs: Mapping[str, Any]


def noise_floor(model: Any, run: ReferenceRun, rerun: Callable[[Any], Mapping[str, Any]],
                carries: Callable[[str], bool]) -> dict[str, Any] | None:
    """The reference's own float32 noise on this case (module docstring), or None where its
    normalised mel is within :data:`EXACT_MEL_NMSE` of the exact one (the bounds as written
    hold).

    Args:
        model: the restored NeMo model (eval, dither off).
        run: its run of the case: the audio, the preprocessor's output, the stages.
        rerun: the stages after the mel on other features (``[1, n_mels, T_padded]``), by
            name, as ``run.outputs`` holds them.
        carries: whether a stage carries the mel's error end to end (the contract's
            :meth:`~audioparity.contract.spec.FamilySpec.carries`): the stages the floor names.

    Returns:
        ``{"from": "mel_features", "mel_nmse": x, "stages": {stage: {"nmse", "max_rel",
        "cosine"}}, "moved": [...]}``: each stage that carries the mel's error, its float32
        output against the same stage on the exact mel; ``moved`` the decodes whose tokens
        differ there (the reference's own choice is undecided at float32 noise), whose
        teacher-forced logits (``decode_logits``, along the reference's own greedy path, which
        the exact run does not take) are left out.
    """
    features, length, outputs = run.features, run.length, run.outputs
    n = int(length[0])
    exact = exact_features(model, run.samples, features, length)
    mel_nmse = metrics.nmse(features[0, :, :n].T.numpy(), exact[0, :, :n].T.numpy())
    if not mel_nmse > EXACT_MEL_NMSE:
        return None
    again = rerun(exact)
    moved = [name for name, value in again.items()
             if isinstance(value, Mapping) and "ids" in value
             and (value["ids"], value.get("frames")) != (outputs[name]["ids"],
                                                         outputs[name].get("frames"))]
    stages = {name: {metric: float(getattr(metrics, metric)(outputs[name], value))
                     for metric in MEASURED}
              for name, value in again.items()
              if carries(name) and not (moved and name == Names.DECODE_LOGITS)}
    return {"from": Names.MEL_FEATURES, "mel_nmse": float(mel_nmse), "stages": stages,
            "moved": moved}


def floor_note(floor: Mapping[str, Any]) -> str:
    """The reference manifest's note of its noise floor (:func:`noise_floor`)."""
    moved = f"; its own {', '.join(floor['moved'])} moves" if floor["moved"] else ""
    largest = max((s["nmse"] for s in floor["stages"].values()), default=0.0)
    return (f"noise floor: NeMo's float32 mel is off its float64 normalisation by NMSE "
            f"{floor['mel_nmse']:.2g} (near-constant mel bins); the stages after it, run "
            f"again on the exact mel, move by up to NMSE {largest:.2g}{moved}")
