"""openmoss (pwilkin/openmoss, Apache-2.0; a MOSS-TTS port on libllama, built against llama.cpp
from the ``llama-cpp-python==0.3.36`` source package) as a MOSS-VoiceGenerator candidate: the
checkpoint converted by openmoss's own converter (:mod:`.openmoss_convert`), then our driver of
its C++ API (``drivers/openmoss_moss_dump.cpp``). openmoss builds the prompt's rows, its input
embeddings and audio heads itself, so ``prompt``, ``input_embeddings`` and ``audio_logits`` are
its own; the backbone runs in its libllama context as it ships it (K/V cache in f16, which its
``LoadOptions`` cannot change). Flash attention is the candidate's option, set explicitly."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audioparity.candidates.adapter import Adapter, Command, Port, TensorMap, ToolCall, WeightName
from audioparity.candidates.llama_cpp import QWEN3_WEIGHTS
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import Option
from audioparity.models.registry import spec_of

#: The stdout line that carries openmoss's prompt rows.
PROMPT_LINE = "prompt: "


class Openmoss(Adapter):
    name = "openmoss"
    title = "openmoss"
    families = ("moss_voicegen",)
    output = "f32json"
    weight_types = ("f32", "bf16")
    options = (
        Option("root", ".ports/openmoss", "the built port (make ports)"),
        Option("flash_attn", "on", "openmoss's LoadOptions.flash_attn (on as it ships)",
               choices=("off", "on")),
    )
    tensors = (
        TensorMap("input_embeddings", "input_embeddings"),
        TensorMap("l_out-{i}", "layer_{i}"),
        TensorMap("last_hidden", "last_hidden"),
        TensorMap("probe_hidden", "probe_hidden"),
        TensorMap("step_last_hidden", "step_last_hidden"),
        TensorMap("text_logits", "text_logits"),
        TensorMap("audio_logits", "audio_logits"),
    )
    printed = TensorMap(PROMPT_LINE, "prompt", omits=("text",),
                        why="openmoss builds the rows itself and exposes no rendered string")
    converts = True
    # its backbone GGUF is llama.cpp's converter's; its extras name the codebooks from 0
    weights = (*QWEN3_WEIGHTS, WeightName("moss.audio_embed.{i}.weight", "emb_ext.{i}.weight"),
               WeightName("moss.audio_head.{i}.weight", "lm_heads.{i}.weight", offset=1))
    port = Port(
        archive="openmoss-*.tar.gz",
        vendors=(("llama_cpp", "vendor/llama.cpp", "third_party/llama.cpp"),),
        drivers=("openmoss_moss_dump.cpp",),
        commands=(
            ("cmake", "-S", ".", "-B", "build", "-DCMAKE_BUILD_TYPE=Release",
             "-DGGML_NATIVE=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_COMMON=OFF"),
            ("cmake", "--build", "build", "-j{jobs}", "--target", "openmoss_core"),
            ("c++", "-std=c++17", "-O2", "-Wall", "-o", "build/bin/openmoss-moss-dump",
             "drivers/openmoss_moss_dump.cpp", "-Iinclude", "-Ithird_party",
             "-Ithird_party/llama.cpp/include", "-Ithird_party/llama.cpp/ggml/include",
             "build/libopenmoss_core.a", "-Lbuild/bin", "-lllama", "-lggml", "-lggml-base",
             "-lpthread", "-Wl,-rpath,$ORIGIN"),
        ),
        products=("build/bin/openmoss-moss-dump", "scripts/convert_hf_to_gguf.py",
                  "third_party/llama.cpp/convert_hf_to_gguf.py"),
    )
    notes = ("the backbone's K/V cache is f16 in openmoss's context (llama.cpp's default; its "
             "LoadOptions has no cache type); layer_{i}: a second context over its model with "
             "the same settings and the eval callback, checked to end in the same hidden "
             "states",
             "audio_logits: the pad column set to -inf, as generation masks it")

    def unavailable(self, stage: str) -> str | None:
        """As :meth:`Adapter.unavailable`; a stage along the reference's path
        (:attr:`~audioparity.contract.spec.Stage.reference_path`: the generation's teacher-forced
        steps) needs the reference's generated rows fed, which its driver does not take."""
        if spec_of(self.families[0]).on_reference_path(stage):
            return (f"{self.title} does not expose it: its driver runs one prefill and one "
                    "cached step on its own prompt rows; it is not fed the reference's "
                    "generated rows")
        return super().unavailable(stage)

    def convert(self, model: Path, weight_type: str, output: Path, *,
                options: Mapping[str, Any]) -> list[list[str]]:
        """openmoss's converter (``--backbone-dtype <weight type>``, the extras f32 at f32,
        bf16 at bf16) into ``output/moss-<weight type>.gguf`` and its ``.extras.gguf``."""
        root = self.root(options)
        return [[sys.executable, str(Path(__file__).with_name("openmoss_convert.py")),
                 str(model), str(_gguf(output, weight_type)), "--outtype", weight_type,
                 "--openmoss", str(root), "--llama-cpp", str(root / "third_party" / "llama.cpp")]]

    def model_files(self, model: Path, options: Mapping[str, Any], weight_type: str
                    ) -> list[Path]:
        """Its backbone GGUF and the ``.extras.gguf`` beside it (the codebook embeddings and
        audio heads), which its run reads."""
        backbone = _gguf(model, weight_type)
        return [backbone, backbone.with_suffix(".extras.gguf")]

    def run(self, call: ToolCall) -> list[Command]:
        """The driver on the converted model and the case's prompt file, writing into
        ``output``."""
        return [([str(self.root(call.options) / "build" / "bin" / "openmoss-moss-dump"),
                  "--model", str(_gguf(call.model, call.weight_type)), "--prompt", str(call.case),
                  "--output-dir", str(call.output), "--threads", str(call.threads),
                  "--flash-attn", call.options["flash_attn"]], {})]

    def parse(self, stdout: str, stderr: str, model: Path | None, *,
              options: Mapping[str, Any]) -> dict:
        """The prompt's document (``{"rows": [[text, code_0, ...], ...]}``) the driver prints
        on its ``prompt:`` line.

        Raises:
            AudioparityError: no ``prompt:`` line, or one that is not a JSON object with rows.
        """
        for line in stdout.splitlines():
            if line.startswith(PROMPT_LINE):
                try:
                    document = json.loads(line.removeprefix(PROMPT_LINE))
                except ValueError as err:
                    raise AudioparityError(f"openmoss-moss-dump: its prompt line is not JSON "
                                           f"({err})") from err
                if isinstance(document, dict) and isinstance(document.get("rows"), list):
                    return document
                break
        raise AudioparityError("openmoss-moss-dump printed no 'prompt: {\"rows\": ...}' line")


def _gguf(model_dir: Path, weight_type: str) -> Path:
    return Path(model_dir) / f"moss-{weight_type}.gguf"
