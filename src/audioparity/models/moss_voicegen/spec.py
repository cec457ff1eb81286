"""MOSS-VoiceGenerator's contract: its name table and its spec (stages, options), as data
(read by :class:`~audioparity.models.moss_voicegen.MossVoicegen`, both sides and the seed
export). Imports none of the family's other modules, so any of them may name a stage."""

from __future__ import annotations

from audioparity.contract.family import reference_names
from audioparity.contract.spec import FamilySpec, Option, Stage, StageName
from audioparity.contract.vocabulary import FLOAT_STORAGE_TYPES, InputKind


class Names(StageName):
    """MOSS-VoiceGenerator's name table: every name its spec's stages and forms are written
    with (:data:`SPEC`; the per-layer ones with :data:`~audioparity.contract.spec.LAYER`,
    ``Names.LAYER.at(3)`` is ``layer_3``) and the ``generation`` document's margins; both sides,
    the replay and the seed export name a stage by its member, never by a literal."""

    PROMPT = "prompt"
    INPUT_EMBEDDINGS = "input_embeddings"
    LAYER = "layer_{i}"
    LAYER_REPLAYED = "layer_{i}_replayed"
    LAST_HIDDEN = "last_hidden"
    PROBE_HIDDEN = "probe_hidden"
    STEP_LAST_HIDDEN = "step_last_hidden"
    TEXT_LOGITS = "text_logits"
    AUDIO_LOGITS = "audio_logits"
    GENERATION_TEXT_LOGITS = "generation_text_logits"
    GENERATION_AUDIO_LOGITS = "generation_audio_logits"
    GENERATION = "generation"
    GENERATION_MARGINS = "generation_margins"




SPEC = FamilySpec(
    name="moss_voicegen",
    command="moss-voicegen",
    title="MOSS-VoiceGenerator text-to-speech backbone (Qwen3 + codebook embeddings) "
          "against PyTorch",
    input=InputKind.PROMPT,
    model="a checkpoint directory (config.json, model.safetensors, tokenizer.json)",
    stages=(
        Stage(Names.PROMPT, "document", "{text, rows}",
              "the rendered prompt and its input rows [S, 1+n_vq] (text processor)"),
        Stage(Names.INPUT_EMBEDDINGS, "tensor", "[S, H]",
              "each prompt row's text embedding plus its n_vq codebook embeddings",
              inputs=(Names.PROMPT,)),
        Stage(Names.LAYER, "tensor", "[S, H]",
              "output of decoder layer i at every prompt row", replayed=Names.LAYER_REPLAYED,
              inputs=(f"{Names.LAYER.previous}|{Names.INPUT_EMBEDDINGS}",)),
        Stage(Names.LAST_HIDDEN, "tensor", "[H]",
              "final hidden state at the last row, full prefill", inputs=(Names.LAYER.last,)),
        Stage(Names.PROBE_HIDDEN, "tensor", "[3, H]",
              "final hidden states at rows 0, 1 and S/2 (a missing causal mask shows here)",
              inputs=(Names.LAYER.last,)),
        Stage(Names.STEP_LAST_HIDDEN, "tensor", "[H]",
              "the last row as one cached step after a prefill of S-1 rows (KV cache, RoPE)",
              inputs=(Names.LAYER.last,)),
        Stage(Names.TEXT_LOGITS, "logits", "[V_text]", "text head at the last row",
              inputs=(Names.LAST_HIDDEN,)),
        Stage(Names.AUDIO_LOGITS, "logits", "[n_vq, audio_vocab_size+1]",
              "audio heads at the last row (pad logit -inf)", inputs=(Names.LAST_HIDDEN,)),
        Stage(Names.GENERATION_TEXT_LOGITS, "logits", "[rows, V_text]",
              "text head deciding each generated row, teacher-forced along the reference's "
              "rows (KV cache): row 0 after the prefill, row j after row j-1",
              reference_path=True, inputs=(Names.TEXT_LOGITS, Names.STEP_LAST_HIDDEN)),
        Stage(Names.GENERATION_AUDIO_LOGITS, "logits", "[rows, n_vq, audio_vocab_size+1]",
              "audio heads deciding each generated row, as generation_text_logits (pad "
              "logit -inf; every head, sampled or not)", reference_path=True,
              inputs=(Names.AUDIO_LOGITS, Names.STEP_LAST_HIDDEN)),
        Stage(Names.GENERATION, "document", "{rows, requested_rows, stopped, ...}",
              "greedy rows under the delay pattern, with generation_margins",
              margins="[rows, 1+n_vq]",
              inputs=(Names.GENERATION_TEXT_LOGITS, Names.GENERATION_AUDIO_LOGITS)),
    ),
    options=(
        Option("kv_cache_type", "f32", "storage type of the KV cache",
               choices=FLOAT_STORAGE_TYPES),
        Option("generate_rows", 16, "rows of greedy generation compared row by row",
               sides=("reference", "ggml"), minimum=1),
        Option("massive_activation", False, "plant one activation channel beyond the f16 "
               "range, as Qwen's attention sinks", sides=("fixture",)),
        Option("remote_code", False, "ship checkpoint-style modeling code (auto_map), "
               "loaded with trust_remote_code like the real checkpoint", sides=("fixture",)),
    ),
    ggml_reads_reference=True,
    references=reference_names(__package__, primary="remote_code"),
)
