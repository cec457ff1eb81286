"""Parakeet (NeMo ``EncDecRNNTBPEModel`` TDT and RNNT, ``EncDecCTCModelBPE``,
``EncDecHybridRNNTCTCBPEModel``): tiny fixture, NeMo reference dump and ggml port."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from audioparity.errors import AudioparityError
from audioparity.family import IMPLEMENTATION, Case, CheckpointWeights, Family, Outputs
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
        from audioparity.audio import load_audio

        sound = load_audio(path, sample_rate=config.preprocessor.sample_rate,
                           min_samples=config.min_samples, purpose="one encoder frame")
        return Case(model, config, options, path, sound, list(sound.notes),
                    {"audio": sound.source})

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
        from audioparity.models.parakeet_tdt.reference import check_inputs
        from audioparity.models.parakeet_tdt.transformers_reference import check_convertible

        implementation = cases[0].options.get(IMPLEMENTATION) if cases else None
        if implementation == "transformers":
            check_convertible(config, Path(model))
        check_inputs(model, config, cases, emulates, implementation or self.spec.references[0])

    def load_reference(self, model: Path, config: Any, options: Mapping[str, Any]) -> Any:
        if options.get(IMPLEMENTATION) == "transformers":
            from audioparity.models.parakeet_tdt.transformers_reference import load_model

            return load_model(model, config)
        import nemo.collections.asr  # noqa: F401  (the one NeMo import of this job)

        from audioparity.models.parakeet_tdt.reference import restore_model

        return restore_model(model)

    def reference_module(self, loaded: Any) -> Any:
        from audioparity.models.parakeet_tdt.transformers_reference import TransformersParakeet

        return loaded.module if isinstance(loaded, TransformersParakeet) else loaded

    def reference(self, loaded: Any, case: Case) -> Outputs:
        from audioparity.models.parakeet_tdt import reference, transformers_reference

        if isinstance(loaded, transformers_reference.TransformersParakeet):
            return transformers_reference.stages(loaded, case)
        return reference.stages(loaded, case, partial(self.spec.carries, "mel_features"))

    def replay(self, loaded: Any, case: Case, candidate: Any) -> Outputs:
        from audioparity.models.parakeet_tdt.replay import stages
        from audioparity.models.parakeet_tdt.transformers_reference import TransformersParakeet

        if isinstance(loaded, TransformersParakeet):
            raise AudioparityError("replay parakeet-tdt: replaying needs the nemo implementation "
                                   "(--implementation nemo)")
        return stages(loaded, case, candidate)

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
