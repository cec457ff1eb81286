"""MOSS-VoiceGenerator (``MossTTSDelayModel``, OpenMOSS): tiny fixture, two PyTorch references
(the checkpoint's modeling code, and transformers' ``Qwen3Model`` without it), our text
processor, and the ggml backbone port."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audioparity.contract.family import Case, CheckpointWeights, Family, Outputs, reference_names
from audioparity.contract.spec import FLOAT32, MATMUL, FamilySpec, Option, Stage
from audioparity.contract.vocabulary import FLOAT_STORAGE_TYPES


class MossVoicegen(Family):
    """OpenMOSS's ``MossTTSDelayModel`` (a Qwen3 backbone with codebook embeddings and heads) and
    our ggml port of it (:mod:`.backbone`)."""

    spec = FamilySpec(
        name="moss_voicegen",
        command="moss-voicegen",
        title="MOSS-VoiceGenerator text-to-speech backbone (Qwen3 + codebook embeddings) "
              "against PyTorch",
        input="prompt",
        model="a checkpoint directory (config.json, model.safetensors, tokenizer.json)",
        stages=(
            Stage("prompt", "document", "{text, rows}",
                  "the rendered prompt and its input rows [S, 1+n_vq] (text processor)"),
            Stage("input_embeddings", "tensor", "[S, H]",
                  "each prompt row's text embedding plus its n_vq codebook embeddings",
                  inputs=("prompt",)),
            Stage("layer_{i}", "tensor", "[S, H]",
                  "output of decoder layer i at every prompt row", replayed="layer_{i}_replayed",
                  inputs=("layer_{i-1}|input_embeddings",)),
            Stage("last_hidden", "tensor", "[H]",
                  "final hidden state at the last row, full prefill", inputs=("layer_{last}",)),
            Stage("probe_hidden", "tensor", "[3, H]",
                  "final hidden states at rows 0, 1 and S/2 (a missing causal mask shows here)",
                  inputs=("layer_{last}",)),
            Stage("step_last_hidden", "tensor", "[H]",
                  "the last row as one cached step after a prefill of S-1 rows (KV cache, RoPE)",
                  inputs=("layer_{last}",)),
            Stage("text_logits", "logits", "[V_text]", "text head at the last row",
                  inputs=("last_hidden",)),
            Stage("audio_logits", "logits", "[n_vq, audio_vocab_size+1]",
                  "audio heads at the last row (pad logit -inf)", inputs=("last_hidden",)),
            Stage("generation_text_logits", "logits", "[rows, V_text]",
                  "text head deciding each generated row, teacher-forced along the reference's "
                  "rows (KV cache): row 0 after the prefill, row j after row j-1",
                  reference_path=True, inputs=("text_logits", "step_last_hidden")),
            Stage("generation_audio_logits", "logits", "[rows, n_vq, audio_vocab_size+1]",
                  "audio heads deciding each generated row, as generation_text_logits (pad "
                  "logit -inf; every head, sampled or not)", reference_path=True,
                  inputs=("audio_logits", "step_last_hidden")),
            Stage("generation", "document", "{rows, requested_rows, stopped, ...}",
                  "greedy rows under the delay pattern, with generation_margins",
                  margins="[rows, 1+n_vq]",
                  inputs=("generation_text_logits", "generation_audio_logits")),
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
        references=reference_names(__name__, primary="remote_code"),
    )
    reference_versions = ("torch", "transformers", "tokenizers")
    ggml_versions = ("ggml_python", "tokenizers")

    def config(self, model: Path) -> Any:
        from audioparity.models.moss_voicegen.config import load_config

        return load_config(model)

    def open_case(self, model: Path, config: Any, path: Path, options: Mapping[str, Any]
                  ) -> Case:
        from audioparity.models.moss_voicegen.text_processor import PROMPT_KEYS, load_prompt

        request = load_prompt(path)
        return Case(model, config, options, path, request,
                    fields={"request": {key: getattr(request, key) for key in PROMPT_KEYS}})

    def manifest_fields(self, config: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        return {"n_layers": config.n_layers}

    def fixture(self, output: Path, *, seed: int, **options: Any) -> None:
        from audioparity.models.moss_voicegen.fixture import build_fixture

        build_fixture(output, seed=seed, **options)

    def check_reference(self, model: Path, config: Any, cases: list[Case], *,
                        emulates: bool) -> None:
        """The memory the longest prompt needs (:func:`.checkpoint.check_memory`), then the
        weights (:func:`.checkpoint.check_weights`: present, shaped, finite)."""
        from audioparity.models.moss_voicegen.checkpoint import check_memory, check_weights

        rows = max((case.options["generate_rows"] for case in cases), default=0)
        check_memory(model, config, [case.data for case in cases], rows, emulates)
        check_weights(model, config)

    def weights(self, model: Path, config: Any) -> CheckpointWeights:
        from audioparity.models.moss_voicegen.checkpoint import checked_blocks, checked_entries

        entries = checked_entries(model, config)
        return CheckpointWeights({name: entry.shape for name, entry in entries.items()},
                                 {name: entry.kind for name, entry in entries.items()},
                                 lambda: checked_blocks(model, entries))

    def weight_kind(self, name: str, shape: tuple[int, ...]) -> str:
        """1-D norm weights float32 (as llama.cpp's converters keep them); every matrix
        (embeddings, projections, heads) in the weight type."""
        return FLOAT32 if len(shape) == 1 else MATMUL

    def ggml(self, runtime: Any, weights: Any, case: Case, reference: Any) -> Outputs:
        from audioparity.models.moss_voicegen.port import stages

        return stages(runtime, weights, case, reference, case.options["generate_rows"],
                      case.options["kv_cache_type"])

    def export_seed(self, dump: Any, folder: Path) -> list[str]:
        from audioparity.models.moss_voicegen.seed import write_seed

        return write_seed(dump, folder)
