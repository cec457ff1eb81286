"""Whisper audio encoder (transformers ``WhisperEncoder``): tiny fixture, PyTorch reference, our
numpy log-mel frontend and the ggml encoder port."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audioparity.family import (
    FLOAT32,
    MATMUL,
    Case,
    CheckpointWeights,
    Family,
    FamilySpec,
    Outputs,
    Stage,
)

#: The weights that enter a matmul as its first operand (``nn.Linear`` of the layers); conv
#: kernels (an f32 im2col and matmul), norms, biases and ``embed_positions`` stay float32.
_MATMUL = re.compile(r"\.(self_attn\.[qkv]_proj|self_attn\.out_proj|fc1|fc2)\.weight$")


class Whisper(Family):
    """transformers' ``WhisperEncoder`` and our ggml port of it (:mod:`.encoder`)."""

    spec = FamilySpec(
        name="whisper",
        command="whisper",
        title="Whisper audio encoder (log-mel frontend, conv stack, transformer) against "
              "transformers' WhisperEncoder",
        input="audio",
        model="a Hugging Face Whisper checkpoint directory (config.json, model.safetensors, "
              "preprocessor_config.json)",
        stages=(
            Stage("mel_features", "tensor", "[T, n_mels]",
                  "log-mel features of the audio padded or trimmed to n_samples (30 s: "
                  "T = 3000), as WhisperFeatureExtractor computes them, time-major"),
            Stage("conv_out", "tensor", "[T, D]",
                  "gelu(conv2(gelu(conv1(mel)))), T' frames, before the positions are added"),
            Stage("layer_{i}", "tensor", "[T, D]", "output of WhisperEncoderLayer i",
                  isolated="layer_{i}_isolated"),
            Stage("enc_out", "tensor", "[T, D]", "encoder output, after the final layer_norm"),
        ),
        ggml_reads_reference=True,
    )
    reference_keeps = ("embed_positions",)

    def config(self, model: Path) -> Any:
        from audioparity.models.whisper.config import load_config

        return load_config(model)

    def open_case(self, model: Path, config: Any, path: Path, options: Mapping[str, Any]
                  ) -> Case:
        from audioparity.audio import load_audio
        from audioparity.models.whisper.frontend import trim_note

        extractor = config.feature_extractor
        sound = load_audio(path, sample_rate=extractor.sampling_rate)
        notes = [*sound.notes, trim_note(len(sound.samples), extractor)]
        return Case(model, config, options, path, sound, [n for n in notes if n],
                    {"audio": sound.source})

    def manifest_fields(self, config: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        return {"n_layers": config.n_layers}

    def fixture(self, output: Path, *, seed: int, **options: Any) -> None:
        from audioparity.models.whisper.fixture import build_fixture

        build_fixture(output, seed=seed)

    def check_reference(self, model: Path, config: Any, cases: list[Case], *,
                        emulates: bool) -> None:
        from audioparity.models.whisper.checkpoint import check_weights

        check_weights(model, config)

    def load_reference(self, model: Path, config: Any, options: Mapping[str, Any]) -> Any:
        from audioparity.models.whisper.reference import load_model

        return load_model(model)

    def reference_module(self, loaded: Any) -> Any:
        return loaded.encoder

    def reference(self, loaded: Any, case: Case) -> Outputs:
        from audioparity.models.whisper.reference import stages

        return stages(loaded, case)

    def weights(self, model: Path, config: Any) -> CheckpointWeights:
        from audioparity.models.whisper.checkpoint import checked_entries

        tensors = checked_entries(model, config)
        return CheckpointWeights({name: entry.shape for name, entry in tensors.entries.items()},
                                 tensors.native, tensors.blocks)

    def weight_kind(self, name: str, shape: tuple[int, ...]) -> str:
        return MATMUL if _MATMUL.search(name) else FLOAT32

    def ggml(self, runtime: Any, weights: Any, case: Case, reference: Any) -> Outputs:
        from audioparity.models.whisper.port import stages

        return stages(runtime, weights, case, reference)
