"""Whisper (transformers ``WhisperForConditionalGeneration``): tiny fixture, PyTorch references
(transformers, and OpenAI's openai-whisper as the second), our numpy log-mel frontend and the
ggml encoder and decoder ports, and the greedy decode."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Case, CheckpointWeights, Family, Outputs
from audioparity.contract.spec import FLOAT32, MATMUL
from audioparity.models.whisper.spec import SPEC

#: The weights that enter a matmul as its first operand: ``nn.Linear`` of the layers (both
#: attentions' projections, ``fc1``, ``fc2``) and the decoder's ``embed_tokens``, which is also
#: the tied ``proj_out`` (stored like the other matrices, as whisper.cpp stores it; its rows are
#: read as stored). Conv kernels (an f32 im2col and matmul), norms, biases and both
#: ``embed_positions`` tables stay float32.
_MATMUL = re.compile(r"\.((self_attn|encoder_attn)\.(q_proj|k_proj|v_proj|out_proj)|fc1|fc2)"
                     r"\.weight$|^decoder\.embed_tokens\.weight$")


class Whisper(Family):
    """transformers' ``WhisperForConditionalGeneration`` and our ggml port of it (:mod:`.encoder`,
    :mod:`.decoder`), with Whisper's greedy decoding (:mod:`.decoding`)."""

    spec = SPEC
    reference_versions = ("torch", "transformers", "openai-whisper")
    reference_keeps = ("model.encoder.embed_positions", "model.decoder.embed_positions")
    reference_prefix = "model."

    def config(self, model: Path) -> Any:
        from audioparity.models.whisper.config import load_config

        return load_config(model)

    def open_case(self, model: Path, config: Any, path: Path, options: Mapping[str, Any]
                  ) -> Case:
        from audioparity.dumping.audio import load_audio
        from audioparity.models.whisper.decoding import prompt_ids
        from audioparity.models.whisper.frontend import trim_note
        from audioparity.models.whisper.tokenizer import TOKENIZER_FILE

        prompt_ids(config, options["language"], options["task"])
        if not (Path(model) / TOKENIZER_FILE).is_file():
            raise AudioparityError(f"{Path(model) / TOKENIZER_FILE}: no such file; the "
                                   "decode's text needs the checkpoint's tokenizer")
        extractor = config.feature_extractor
        sound = load_audio(path, sample_rate=extractor.sampling_rate)
        notes = [*sound.notes, trim_note(len(sound.samples), extractor)]
        return Case(model, config, options, path, sound, [n for n in notes if n],
                    {self.spec.input: sound.source})

    def manifest_fields(self, config: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        return {"n_layers": config.n_layers, "n_decoder_layers": config.n_decoder_layers}

    def fixture(self, output: Path, *, seed: int, **options: Any) -> None:
        from audioparity.models.whisper.fixture import build_fixture

        build_fixture(output, seed=seed)

    def check_reference(self, model: Path, config: Any, cases: list[Case], *,
                        emulates: bool) -> None:
        from audioparity.models.whisper.checkpoint import check_weights

        check_weights(model, config)

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
