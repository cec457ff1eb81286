"""Whisper audio encoder (transformers ``WhisperEncoder``): tiny fixture, PyTorch reference dump,
our numpy log-mel frontend and the ggml encoder port with its dump."""

from audioparity.families import FamilySpec, Stage

SPEC = FamilySpec(
    name="whisper_encoder",
    command="whisper-encoder",
    title="Whisper audio encoder (log-mel frontend, conv stack, transformer) against "
          "transformers' WhisperEncoder",
    input="audio",
    model="a Hugging Face Whisper checkpoint directory (config.json, model.safetensors, "
          "preprocessor_config.json)",
    stages=(
        Stage("mel_features", "tensor", "[T, n_mels]",
              "log-mel features of the audio padded or trimmed to n_samples (30 s: T = 3000), "
              "as WhisperFeatureExtractor computes them, time-major"),
        Stage("conv_out", "tensor", "[T, D]",
              "gelu(conv2(gelu(conv1(mel)))), T' frames, before the positions are added"),
        Stage("layer_{i}", "tensor", "[T, D]", "output of WhisperEncoderLayer i",
              isolated="layer_{i}_isolated"),
        Stage("enc_out", "tensor", "[T, D]", "encoder output, after the final layer_norm"),
    ),
    entry_points={
        "fixture": "audioparity.models.whisper_encoder.fixture:build_fixture",
        "reference": "audioparity.models.whisper_encoder.reference:dump_reference",
        "ggml": "audioparity.models.whisper_encoder.dump:dump_ggml",
        "weights": "audioparity.models.whisper_encoder.weights:save_weights",
    },
    fixture_model="",
    ggml_reads_reference=True,
)
