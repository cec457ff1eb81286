"""llama.cpp (ggml-org/llama.cpp, MIT; libllama 0.5.0 as vendored by the source package
``llama-cpp-python==0.3.36``) as a MOSS-VoiceGenerator backbone candidate: the checkpoint's
Qwen3 part converted by llama.cpp's own ``convert_hf_to_gguf.py`` (:mod:`.llama_cpp_convert`),
then our driver of ``llama.h`` (``drivers/llama_moss_dump.c``) fed the reference's input
embeddings, as a TTS port on llama.cpp feeds the host's sum of the text and codebook
embeddings. Flash attention and the KV-cache type are the candidate's options, set explicitly,
never llama.cpp's ``auto``."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audioparity.candidates.adapter import Adapter, Command, Port, TensorMap
from audioparity.errors import AudioparityError
from audioparity.family import FamilySpec, Option

#: The prompt's input embeddings as the driver reads them (raw float32 ``[S, H]``).
EMBEDDINGS = "input_embeddings.raw"


class LlamaCpp(Adapter):
    name = "llama_cpp"
    title = "llama.cpp"
    families = ("moss_voicegen",)
    output = "f32json"
    weight_types = ("f32", "f16", "bf16", "q8_0")
    options = (
        Option("root", ".ports/llama_cpp", "the built port (make ports)"),
        Option("flash_attn", "off", "llama.cpp's flash attention (flash_attn_type)",
               choices=("off", "on")),
        Option("kv_cache_type", "f32", "llama.cpp's KV-cache type (type_k and type_v)",
               choices=("f32", "f16")),
    )
    tensors = (
        TensorMap("l_out-{i}", "layer_{i}"),
        TensorMap("last_hidden", "last_hidden"),
        TensorMap("probe_hidden", "probe_hidden"),
        TensorMap("step_last_hidden", "step_last_hidden"),
        TensorMap("text_logits", "text_logits"),
    )
    converts = True
    reads_reference = True
    inputs = (TensorMap(EMBEDDINGS, "input_embeddings"),)
    port = Port(
        download="llama-cpp-python==0.3.36",
        download_sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
        drivers=("llama_moss_dump.c",),
        commands=(
            ("cmake", "-S", "vendor/llama.cpp", "-B", "build", "-DCMAKE_BUILD_TYPE=Release",
             "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
             "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF",
             "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=OFF"),
            ("cmake", "--build", "build", "-j{jobs}", "--target", "llama"),
            ("cc", "-O2", "-Wall", "-o", "build/bin/llama-moss-dump",
             "drivers/llama_moss_dump.c", "-Ivendor/llama.cpp/include",
             "-Ivendor/llama.cpp/ggml/include", "-Lbuild/bin", "-lllama", "-lggml",
             "-lggml-base", "-Wl,-rpath,$ORIGIN"),
        ),
        products=("build/bin/llama-moss-dump", "vendor/llama.cpp/convert_hf_to_gguf.py"),
    )
    notes = ("input_embeddings: llama.cpp takes them as its input (llama_batch.embd), the "
             "reference's; the codebook embeddings and audio heads are not Qwen3 parts and stay "
             "on the host, so audio_logits and generation are not its",)

    def unavailable(self, stage: str) -> str | None:
        """Its input, as :meth:`Adapter.unavailable` says; any other stage it does not expose
        is the host's (the prompt's rows, the audio heads, generation)."""
        return super().unavailable(stage) or (
            "llama.cpp does not expose it: it runs the Qwen3 backbone only, fed the reference's "
            "input embeddings; the prompt's rows, the codebook embeddings and the audio heads "
            "are not Qwen3 parts and stay on the host")

    def convert(self, model: Path, weight_type: str, output: Path, *,
                options: Mapping[str, Any]) -> list[list[str]]:
        """The backbone re-laid as Qwen3 and converted by ``convert_hf_to_gguf.py --outtype
        <weight type>`` (its own f16, bf16 and q8_0) into ``output/model-<weight type>.gguf``."""
        return [[sys.executable, str(Path(__file__).with_name("llama_cpp_convert.py")),
                 str(Path(output) / "qwen3"), str(_gguf(output, weight_type)), "--outtype",
                 weight_type, "--llama-cpp", str(self.root(options) / "vendor" / "llama.cpp"),
                 "--from-moss", str(model)]]

    def prepare(self, reference: Path | None, folder: Path, *, options: Mapping[str, Any]
                ) -> Path:
        """Each of its :attr:`inputs` (the prompt's input embeddings ``[S, H]``) from the
        reference dump as the raw float32 file the driver reads, into the new folder
        ``folder``.

        Raises:
            AudioparityError: the reference dump is not ``ok`` or lacks one.
        """
        from audioparity.artifacts import Dump

        dump = Dump(reference)
        lacking = [m.stage for m in self.inputs if dump.status != "ok" or not dump.has(m.stage)]
        if lacking:
            raise AudioparityError(f"{reference}: expected a MOSS reference dump of status ok "
                                   f"with {', '.join(lacking)}")
        folder.mkdir(parents=True)
        for mapping in self.inputs:
            dump.tensor(mapping.stage).astype("<f4").tofile(folder / mapping.source)
        return folder

    def run(self, model: Path, case: Path, output: Path, *, spec: FamilySpec,
            family_options: Mapping[str, Any], options: Mapping[str, Any], weight_type: str,
            backend: str, threads: int, reference: Path | None) -> list[Command]:
        """The driver on the converted model and the prepared embeddings, writing into
        ``output``."""
        return [([str(self.root(options) / "build" / "bin" / "llama-moss-dump"), "--model",
                  str(_gguf(model, weight_type)), "--embeddings", str(reference / EMBEDDINGS),
                  "--output-dir", str(output), "--threads", str(threads), "--flash-attn",
                  options["flash_attn"], "--kv-type", options["kv_cache_type"]], {})]


def _gguf(model_dir: Path, weight_type: str) -> Path:
    return Path(model_dir) / f"model-{weight_type}.gguf"
