"""Whisper's contract: its name table and its spec (stages, options), as data (read by
:class:`~audioparity.models.whisper.Whisper`, the ggml port, both references and the replay).
Imports none of the family's other modules, so any of them may name a stage."""

from __future__ import annotations

from audioparity.contract.family import reference_names
from audioparity.contract.spec import FamilySpec, Option, Stage, StageName
from audioparity.contract.vocabulary import InputKind


class Names(StageName):
    """Whisper's name table: every name its spec's stages and forms are written with (a
    per-layer one with :data:`~audioparity.contract.spec.LAYER`, ``Names.LAYER.at(3)`` is
    ``layer_3``) and the decode's margins; the code names a stage by its member, never by a
    literal."""

    MEL_FEATURES = "mel_features"
    CONV_OUT = "conv_out"
    LAYER = "layer_{i}"
    LAYER_ISOLATED = "layer_{i}_isolated"
    LAYER_REPLAYED = "layer_{i}_replayed"
    ENC_OUT = "enc_out"
    DECODER_LAYER = "decoder_layer_{i}"
    DECODER_LAYER_ISOLATED = "decoder_layer_{i}_isolated"
    DECODER_LOGITS = "decoder_logits"
    DECODE = "decode"
    DECODE_MARGINS = "decode_margins"
    DECODER_REPLAY = "decoder_replay"



SPEC = FamilySpec(
    name="whisper",
    command="whisper",
    title="Whisper speech recognition (log-mel frontend, encoder, decoder, greedy decode) "
          "against transformers' WhisperForConditionalGeneration",
    input=InputKind.AUDIO,
    model="a Hugging Face Whisper checkpoint directory (config.json, model.safetensors, "
          "preprocessor_config.json, generation_config.json, tokenizer.json)",
    stages=(
        Stage(Names.MEL_FEATURES, "tensor", "[T, n_mels]",
              "log-mel features of the audio padded or trimmed to n_samples (30 s: "
              "T = 3000), as WhisperFeatureExtractor computes them, time-major"),
        Stage(Names.CONV_OUT, "tensor", "[T, D]",
              "gelu(conv2(gelu(conv1(mel)))), T' frames, before the positions are added",
              inputs=(Names.MEL_FEATURES,)),
        Stage(Names.LAYER, "tensor", "[T, D]", "output of WhisperEncoderLayer i",
              isolated=Names.LAYER_ISOLATED, replayed=Names.LAYER_REPLAYED,
              inputs=(f"{Names.LAYER.previous}|{Names.CONV_OUT}",)),
        Stage(Names.ENC_OUT, "tensor", "[T, D]", "encoder output, after the final layer_norm",
              inputs=(Names.LAYER.last,)),
        Stage(Names.DECODER_LAYER, "tensor", "[S, D]",
              "output of WhisperDecoderLayer i over the teacher-forced tokens (the prompt "
              "and the reference's decoded ids)", isolated=Names.DECODER_LAYER_ISOLATED,
              reference_path=True, inputs=(Names.DECODER_LAYER.previous, Names.ENC_OUT)),
        Stage(Names.DECODER_LOGITS, "logits", "[S, V]",
              "proj_out of the decoder at every teacher-forced token: row j predicts token "
              "j+1", reference_path=True, inputs=(Names.DECODER_LAYER.last,)),
        Stage(Names.DECODE, "document", "{ids, text}",
              "greedy decode with the KV cache: the generated ids (no prompt, no "
              "<|endoftext|>) and their text; decoder_replay runs the ggml decoder on the "
              "reference enc_out", isolated=Names.DECODER_REPLAY, margins="[positions]",
              inputs=(Names.DECODER_LOGITS,)),
    ),
    options=(
        Option("language", "", "a multilingual model's language token (en or <|en|>); '' "
               "for an English-only model", sides=("reference", "ggml")),
        Option("task", "transcribe", "a multilingual model's task token",
               sides=("reference", "ggml"), choices=("transcribe", "translate")),
    ),
    ggml_reads_reference=True,
    references=reference_names(__package__, primary="transformers"),
)
