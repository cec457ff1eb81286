"""Whisper (transformers ``WhisperForConditionalGeneration``): tiny fixture, PyTorch references
(transformers, and OpenAI's openai-whisper as the second), our numpy log-mel frontend and the
ggml encoder and decoder ports, and the greedy decode."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Case, CheckpointWeights, Family, Outputs, reference_names
from audioparity.contract.spec import FLOAT32, MATMUL, FamilySpec, Option, Stage

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

    spec = FamilySpec(
        name="whisper",
        command="whisper",
        title="Whisper speech recognition (log-mel frontend, encoder, decoder, greedy decode) "
              "against transformers' WhisperForConditionalGeneration",
        input="audio",
        model="a Hugging Face Whisper checkpoint directory (config.json, model.safetensors, "
              "preprocessor_config.json, generation_config.json, tokenizer.json)",
        stages=(
            Stage("mel_features", "tensor", "[T, n_mels]",
                  "log-mel features of the audio padded or trimmed to n_samples (30 s: "
                  "T = 3000), as WhisperFeatureExtractor computes them, time-major"),
            Stage("conv_out", "tensor", "[T, D]",
                  "gelu(conv2(gelu(conv1(mel)))), T' frames, before the positions are added",
                  inputs=("mel_features",)),
            Stage("layer_{i}", "tensor", "[T, D]", "output of WhisperEncoderLayer i",
                  isolated="layer_{i}_isolated", replayed="layer_{i}_replayed",
                  inputs=("layer_{i-1}|conv_out",)),
            Stage("enc_out", "tensor", "[T, D]", "encoder output, after the final layer_norm",
                  inputs=("layer_{last}",)),
            Stage("decoder_layer_{i}", "tensor", "[S, D]",
                  "output of WhisperDecoderLayer i over the teacher-forced tokens (the prompt "
                  "and the reference's decoded ids)", isolated="decoder_layer_{i}_isolated",
                  reference_path=True, inputs=("decoder_layer_{i-1}", "enc_out")),
            Stage("decoder_logits", "logits", "[S, V]",
                  "proj_out of the decoder at every teacher-forced token: row j predicts token "
                  "j+1", reference_path=True, inputs=("decoder_layer_{last}",)),
            Stage("decode", "document", "{ids, text}",
                  "greedy decode with the KV cache: the generated ids (no prompt, no "
                  "<|endoftext|>) and their text; decoder_replay runs the ggml decoder on the "
                  "reference enc_out", isolated="decoder_replay", margins="[positions]",
                  inputs=("decoder_logits",)),
        ),
        options=(
            Option("language", "", "a multilingual model's language token (en or <|en|>); '' "
                   "for an English-only model", sides=("reference", "ggml")),
            Option("task", "transcribe", "a multilingual model's task token",
                   sides=("reference", "ggml"), choices=("transcribe", "translate")),
        ),
        ggml_reads_reference=True,
        references=reference_names(__name__, primary="transformers"),
    )
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
                    {"audio": sound.source})

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
