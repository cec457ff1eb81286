"""MOSS-VoiceGenerator (``MossTTSDelayModel``, OpenMOSS): tiny fixture, PyTorch reference dump,
our text processor, and the ggml backbone port with its dump."""

from audioparity.families import FamilySpec, Option, Stage
from audioparity.vocabulary import FLOAT_STORAGE_TYPES

SPEC = FamilySpec(
    name="moss_voicegen",
    command="moss-voicegen",
    title="MOSS-VoiceGenerator text-to-speech backbone (Qwen3 + codebook embeddings) against "
          "PyTorch",
    input="prompt",
    model="a checkpoint directory (config.json, model.safetensors, tokenizer.json)",
    stages=(
        Stage("prompt", "document", "{text, rows}",
              "the rendered prompt and its input rows [S, 1+n_vq] (text processor)"),
        Stage("input_embeddings", "tensor", "[S, H]",
              "each prompt row's text embedding plus its n_vq codebook embeddings"),
        Stage("layer_{i}", "tensor", "[S, H]", "output of decoder layer i at every prompt row",
              replayed="layer_{i}_replayed"),
        Stage("last_hidden", "tensor", "[H]", "final hidden state at the last row, full prefill"),
        Stage("probe_hidden", "tensor", "[3, H]",
              "final hidden states at rows 0, 1 and S/2 (a missing causal mask shows here)"),
        Stage("step_last_hidden", "tensor", "[H]",
              "the last row as one cached step after a prefill of S-1 rows (KV cache, RoPE)"),
        Stage("text_logits", "tensor", "[V_text]", "text head at the last row"),
        Stage("audio_logits", "tensor", "[n_vq, audio_vocab_size+1]",
              "audio heads at the last row (pad logit -inf)"),
        Stage("generation", "document", "{rows, requested_rows, stopped, ...}",
              "greedy rows under the delay pattern, with generation_margins"),
    ),
    entry_points={
        "fixture": "audioparity.models.moss_voicegen.fixture:build_fixture",
        "reference": "audioparity.models.moss_voicegen.reference:dump_reference",
        "ggml": "audioparity.models.moss_voicegen.dump:dump_ggml",
        "weights": "audioparity.models.moss_voicegen.weights:save_weights",
        "replay": "audioparity.models.moss_voicegen.replay:dump_replay",
    },
    options=(
        Option("kv_cache_type", "f32", "storage type of the KV cache", choices=FLOAT_STORAGE_TYPES),
        Option("generate_rows", 16, "rows of greedy generation compared row by row",
               sides=("reference", "ggml"), minimum=1),
        Option("massive_activation", False, "plant one activation channel beyond the f16 "
               "range, as Qwen's attention sinks", sides=("fixture",)),
        Option("remote_code", False, "ship checkpoint-style modeling code (auto_map), loaded "
               "with trust_remote_code like the real checkpoint", sides=("fixture",)),
    ),
)
