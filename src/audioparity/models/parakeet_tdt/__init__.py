"""Parakeet (NeMo ``EncDecRNNTBPEModel`` TDT and RNNT, ``EncDecCTCModelBPE``,
``EncDecHybridRNNTCTCBPEModel``): tiny fixture, NeMo reference dump and ggml port."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audioparity.contract.family import Case, CheckpointWeights, Family, Outputs
from audioparity.models.parakeet_tdt.spec import CTC, SPEC, TRANSDUCER


class ParakeetTdt(Family):
    """NeMo's Parakeet models and our ggml port of them (:mod:`.encoder`, :mod:`.decoder`,
    :mod:`.ctc`)."""

    spec = SPEC
    reference_versions = ("torch", "nemo_toolkit", "transformers")

    def config(self, model: Path) -> Any:
        from audioparity.models.parakeet_tdt.config import load_config

        return load_config(model)

    def open_case(self, model: Path, config: Any, path: Path, options: Mapping[str, Any]
                  ) -> Case:
        from audioparity.dumping.audio import load_audio

        sound = load_audio(path, sample_rate=config.preprocessor.sample_rate,
                           min_samples=config.min_samples, purpose="one encoder frame")
        return Case(model, config, options, path, sound, list(sound.notes),
                    {self.spec.input: sound.source})

    def heads(self, config: Any) -> tuple[str, ...]:
        return (*((TRANSDUCER,) if config.transducer else ()),
                *((CTC,) if config.ctc is not None else ()))

    def manifest_fields(self, config: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        return {"n_layers": config.encoder.n_layers}

    def fixture(self, output: Path, *, seed: int, **options: Any) -> None:
        from audioparity.models.parakeet_tdt.fixture import build_fixture

        build_fixture(output, seed=seed, **options)

    def check_reference(self, model: Path, config: Any, cases: list[Case], *,
                        emulates: bool) -> None:
        """Each case's encoder attention against the memory free
        (:func:`.checkpoint.check_attention_memory`), then the checkpoint's tensors
        (:func:`.checkpoint.check_weights`: present, shaped as the config says, finite), with
        the ggml side's messages."""
        from audioparity.models.parakeet_tdt.checkpoint import (
            check_attention_memory,
            check_weights,
        )

        for case in cases:
            n_mel = case.data.samples.size // config.preprocessor.hop_length  # valid mel frames
            check_attention_memory(case.path, model, config.encoder,
                                   config.encoder.subsampled_length(n_mel), emulates)
        check_weights(model, config)

    def weights(self, model: Path, config: Any) -> CheckpointWeights:
        from audioparity.models.parakeet_tdt.layout import checkpoint_weights

        return checkpoint_weights(model, config)

    def weight_kind(self, name: str, shape: tuple[int, ...]) -> str:
        from audioparity.models.parakeet_tdt.layout import weight_kind

        return weight_kind(name, shape)

    def ggml(self, runtime: Any, weights: Any, case: Case, reference: Any) -> Outputs:
        from audioparity.models.parakeet_tdt.port import stages

        return stages(runtime, weights, case, reference)

    def export_seed(self, dump: Any, folder: Path) -> list[str]:
        from audioparity.models.parakeet_tdt.seed import write_seed

        return write_seed(dump, folder)
