"""llama.cpp (ggml-org/llama.cpp, MIT; libllama 0.5.0 as vendored by the source package
``llama-cpp-python==0.3.36``) as a MOSS-VoiceGenerator backbone candidate: the checkpoint's
Qwen3 part converted by llama.cpp's own ``convert_hf_to_gguf.py`` (:mod:`.llama_cpp_convert`),
then our driver of ``llama.h`` (``drivers/llama_moss_dump.c``) fed the reference's input
embeddings, as a TTS port on llama.cpp feeds the host's sum of the text and codebook
embeddings. Flash attention and the KV-cache type are the candidate's options, set explicitly,
never llama.cpp's ``auto``."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audioparity.candidates.adapter import Adapter, Command, Port, TensorMap, ToolCall, WeightName
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import Option
from audioparity.contract.vocabulary import MIXES, STORAGE_TYPES

#: The prompt's input embeddings as the driver reads them (raw float32 ``[S, H]``).
EMBEDDINGS = "input_embeddings.raw"
#: The types its converter writes itself (``convert_hf_to_gguf.py --outtype``).
CONVERTER_TYPES = ("f32", "f16", "bf16", "q8_0")
#: The ``llama-quantize`` type (``tools/quantize``'s list) that makes each other weight type from
#: the f32 GGUF, with ``--pure``: the k-quants' names are its aliases of the ``_M`` mixtures
#: (``Q4_K`` is ``Q4_K_M``) and ``MXFP4_MOE`` a mixture too (MXFP4 experts, q8_0 elsewhere), and
#: ``--pure`` keeps each one's default type (q4_K, mxfp4) for every tensor it quantizes; a tensor
#: whose rows do not fill the type's blocks still falls back (q4_K to q5_0, q5_K to q5_1, q6_K to
#: q8_0, q2_K and q3_K to q4_0; then f16).
QUANTIZE_TYPES = {"q8_0": "Q8_0", "q6_K": "Q6_K", "q5_1": "Q5_1", "q5_0": "Q5_0", "q5_K": "Q5_K",
                  "q4_1": "Q4_1", "q4_0": "Q4_0", "q4_K": "Q4_K", "iq4_nl": "IQ4_NL",
                  "mxfp4": "MXFP4_MOE", "q3_K": "Q3_K", "q2_K": "Q2_K"}
#: The mixes people ship (:data:`~audioparity.contract.vocabulary.MIXES`), each its
#: ``llama-quantize`` type without ``--pure``: the tool's own choice of type tensor by tensor.
MIX_TYPES = {mix: mix.replace("_k_", "_K_").upper() for mix in MIXES}


#: llama.cpp's names of a Qwen3 layer's tensors (``gguf-py``'s ``TensorNameMap``), by the MOSS
#: checkpoint's (``language_model.layers.{i}.*``).
LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
               "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
#: Its weight map of the backbone (the text head ``lm_heads.0`` is its ``output``).
QWEN3_WEIGHTS = (
    WeightName("token_embd.weight", "language_model.embed_tokens.weight"),
    WeightName("output_norm.weight", "language_model.norm.weight"),
    WeightName("output.weight", "lm_heads.0.weight"),
    *(WeightName(f"blk.{{i}}.{ours}.weight", f"language_model.layers.{{i}}.{theirs}.weight")
      for theirs, ours in LAYER_NAMES.items()))


class LlamaCpp(Adapter):
    name = "llama_cpp"
    title = "llama.cpp"
    families = ("moss_voicegen",)
    output = "f32json"
    weight_types = (*CONVERTER_TYPES, *(t for t in QUANTIZE_TYPES if t not in CONVERTER_TYPES),
                    *MIX_TYPES)
    options = (
        Option("root", ".ports/llama_cpp", "the built port (make ports)"),
        Option("flash_attn", "off", "llama.cpp's flash attention (flash_attn_type)",
               choices=("off", "on")),
        Option("kv_cache_type", "f32", "llama.cpp's KV-cache type (type_k and type_v)",
               choices=("f32", "f16")),
        Option("tensor_types", {}, "per-tensor types over a quantized weight type: {pattern: "
               "type}, each llama-quantize's --tensor-type pattern=type (a regular expression "
               "searched in the tensor's lowercased GGUF name, the first that matches wins)"),
    )
    tensors = (
        TensorMap("l_out-{i}", "layer_{i}"),
        TensorMap("last_hidden", "last_hidden"),
        TensorMap("probe_hidden", "probe_hidden"),
        TensorMap("step_last_hidden", "step_last_hidden"),
        TensorMap("text_logits", "text_logits"),
    )
    converts = True
    weights = QWEN3_WEIGHTS
    reads_reference = True
    inputs = (TensorMap(EMBEDDINGS, "input_embeddings"),)
    port = Port(
        download="llama-cpp-python==0.3.36",
        download_sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
        drivers=("llama_moss_dump.c",),
        commands=(
            ("cmake", "-S", "vendor/llama.cpp", "-B", "build", "-DCMAKE_BUILD_TYPE=Release",
             "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
             "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
             "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=OFF"),
            # the tools are configured for llama-quantize alone, its quantizer
            ("cmake", "--build", "build", "-j{jobs}", "--target", "llama", "llama-quantize"),
            ("cc", "-O2", "-Wall", "-o", "build/bin/llama-moss-dump",
             "drivers/llama_moss_dump.c", "-Ivendor/llama.cpp/include",
             "-Ivendor/llama.cpp/ggml/include", "-Lbuild/bin", "-lllama", "-lggml",
             "-lggml-base", "-Wl,-rpath,$ORIGIN"),
        ),
        products=("build/bin/llama-moss-dump", "build/bin/llama-quantize",
                  "vendor/llama.cpp/convert_hf_to_gguf.py"),
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

    def check_options(self, values: Any, where: str) -> dict[str, Any]:
        """As :meth:`Adapter.check_options`, and ``tensor_types`` maps patterns to types of
        :data:`~audioparity.contract.vocabulary.STORAGE_TYPES`."""
        checked = super().check_options(values, where)
        for pattern, kind in checked["tensor_types"].items():
            if not isinstance(pattern, str) or not pattern or kind not in STORAGE_TYPES:
                raise AudioparityError(f"{where}['tensor_types'][{pattern!r}]: {kind!r}; expected "
                                       f"a pattern to one of {', '.join(STORAGE_TYPES)}")
            try:
                re.compile(pattern)
            except re.error as err:
                raise AudioparityError(f"{where}['tensor_types']: {pattern!r} is not a regular "
                                       f"expression ({err})") from None
        return checked

    def convert(self, model: Path, weight_type: str, output: Path, *,
                options: Mapping[str, Any]) -> list[list[str]]:
        """The backbone re-laid as Qwen3 and converted by ``convert_hf_to_gguf.py --outtype``
        into ``output/model-<weight type>.gguf``: its own f32, f16, bf16 and q8_0; any other
        type, or a quantized one with the option ``tensor_types``, is ``llama-quantize --pure``
        of its f32 GGUF (:data:`QUANTIZE_TYPES`), each ``tensor_types`` entry a
        ``--tensor-type pattern=type``.

        ``--pure``, because llama-quantize's types are mixtures otherwise (``Q4_K_M`` stores
        ``attn_v`` and half the ``ffn_down`` q6_K, the output q6_K, ...): a cell of a weight
        type then holds that type wherever the tool quantizes, but where a tensor's rows do not
        fill its blocks (the fallbacks, recorded by the cell) or ``tensor_types`` says otherwise.
        A mix (``q4_K_M``, :data:`MIX_TYPES`) is the tool's mixture itself, without ``--pure``.

        Raises:
            AudioparityError: ``tensor_types`` with a float weight type, over which
                llama-quantize applies none.
        """
        tensor_types = options.get("tensor_types") or {}
        quantized = {**QUANTIZE_TYPES, **MIX_TYPES}
        if tensor_types and weight_type not in quantized:
            raise AudioparityError(f"llama.cpp: tensor_types over {weight_type}: llama-quantize "
                                   "applies --tensor-type over a quantized type only")
        base = weight_type if weight_type in CONVERTER_TYPES and not tensor_types else "f32"
        commands = [[sys.executable, str(Path(__file__).with_name("llama_cpp_convert.py")),
                     str(Path(output) / "qwen3"), str(_gguf(output, base)), "--outtype", base,
                     "--llama-cpp", str(self.root(options) / "vendor" / "llama.cpp"),
                     "--from-moss", str(model)]]
        if base != weight_type:
            pure = [] if weight_type in MIX_TYPES else ["--pure"]
            commands.append([str(self.root(options) / "build" / "bin" / "llama-quantize"),
                             *pure, *(arg for pattern, kind in tensor_types.items()
                                      for arg in ("--tensor-type", f"{pattern}={kind}")),
                             str(_gguf(output, base)), str(_gguf(output, weight_type)),
                             quantized[weight_type]])
        return commands

    def recipe_options(self, recipe: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        """A recipe as ``tensor_types``: each override a ``--tensor-type`` of its GGUF name
        (its weight map read backwards), matched whole, before the entry's own patterns; an
        override of a weight its file does not hold (the codebook embeddings and audio heads,
        which stay on the host) none."""
        mapped = {f"^{re.escape(name)}$": kind for weight, kind in recipe.overrides.items()
                  if (name := self.port_name(weight)) != weight}
        return {**options, "tensor_types": {**mapped, **(options.get("tensor_types") or {})}}

    def model_files(self, model: Path, options: Mapping[str, Any], weight_type: str
                    ) -> list[Path]:
        """The GGUF its run reads."""
        return [_gguf(model, weight_type)]

    def requested_type(self, tensor: Any, weight_type: str, options: Mapping[str, Any]
                       ) -> str | None:
        """As :meth:`Adapter.requested_type`, but the type of the first ``tensor_types``
        pattern found in a matmul weight's lowercased name, as llama-quantize picks it."""
        wanted = super().requested_type(tensor, weight_type, options)
        if wanted is None or weight_type not in QUANTIZE_TYPES:
            return wanted
        return next((kind for pattern, kind in (options.get("tensor_types") or {}).items()
                     if re.search(pattern.lower(), tensor.name.lower())), wanted)

    def prepare(self, reference: Path | None, folder: Path, *, options: Mapping[str, Any]
                ) -> Path:
        """Each of its :attr:`inputs` (the prompt's input embeddings ``[S, H]``) from the
        reference dump as the raw float32 file the driver reads, into the new folder
        ``folder``.

        Raises:
            AudioparityError: the reference dump is not ``ok`` or lacks one.
        """
        from audioparity.dumping.artifacts import Dump

        dump = Dump(reference)
        lacking = [m.stage for m in self.inputs if dump.status != "ok" or not dump.has(m.stage)]
        if lacking:
            raise AudioparityError(f"{reference}: expected a MOSS reference dump of status ok "
                                   f"with {', '.join(lacking)}")
        folder.mkdir(parents=True)
        for mapping in self.inputs:
            dump.tensor(mapping.stage).astype("<f4").tofile(folder / mapping.source)
        return folder

    def run(self, call: ToolCall) -> list[Command]:
        """The driver on the converted model and the prepared embeddings, writing into
        ``output``."""
        return [([str(self.root(call.options) / "build" / "bin" / "llama-moss-dump"),
                  "--model", str(_gguf(call.model, call.weight_type)),
                  "--embeddings", str(call.reference / EMBEDDINGS),
                  "--output-dir", str(call.output), "--threads", str(call.threads),
                  "--flash-attn", call.options["flash_attn"],
                  "--kv-type", call.options["kv_cache_type"]], {})]


def _gguf(model_dir: Path, weight_type: str) -> Path:
    return Path(model_dir) / f"model-{weight_type}.gguf"
