"""MOSS-VoiceGenerator (``MossTTSDelayModel``, OpenMOSS): tiny fixture, two PyTorch references
(the checkpoint's modeling code, and transformers' ``Qwen3Model`` without it), our text
processor, and the ggml backbone port."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audioparity.contract.family import Case, CheckpointWeights, Family, Outputs
from audioparity.contract.spec import FLOAT32, MATMUL
from audioparity.models.moss_voicegen.spec import SPEC


class MossVoicegen(Family):
    """OpenMOSS's ``MossTTSDelayModel`` (a Qwen3 backbone with codebook embeddings and heads) and
    our ggml port of it (:mod:`.backbone`)."""

    spec = SPEC
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
