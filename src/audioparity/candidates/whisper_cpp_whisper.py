"""whisper.cpp's own Whisper (ggml-org/whisper.cpp, MIT; ggml 0.21.0 vendored) as a candidate
of the Whisper family: the transformers checkpoint converted by its ``convert-h5-to-ggml.py``
(OpenAI's mel filters from the ``openai-whisper`` source package), quantized by its
``whisper-quantize``, then our driver of ``whisper.h`` (``drivers/whisper_cpp_dump.cpp``): its
transcript (``whisper_full``, greedy) and its decoder's logits teacher-forced along the
reference's tokens. Its C API returns no activation, so those two are what is compared."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.candidates.adapter import Adapter, Command, TensorMap, ToolCall, WeightName
from audioparity.candidates.model_file import ggml_bin_tensors
from audioparity.candidates.whisper_cpp import PORT, QUANTIZED
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import Option

#: The teacher-forced tokens as the driver reads them (raw little-endian int32 ``[S]``).
TOKENS = "tokens.i32"
#: The reference's log-mel as the driver reads it with ``--mel`` (raw float32 ``[n_mels, T]``),
#: with the option ``mel`` ``reference``.
REFERENCE_MEL = TensorMap("mel.f32", "mel_features", layout="[n_mels, T]")
#: The prefix of the driver's one line on stdout holding its transcript.
DECODE_LINE = "decode: "
#: The files of the converted model at each weight type: the converter's own names (f32 with
#: its f32 flag, f16 without), a quantized type's made by ``whisper-quantize`` from the f16 one.
MODEL_FILES = {"f32": "ggml-model-f32.bin", "f16": "ggml-model.bin",
               **{kind: f"ggml-model-{kind}.bin" for kind in QUANTIZED}}
#: The header of its Whisper ``.bin`` (``convert-h5-to-ggml.py``), as
#: :func:`~audioparity.candidates.model_file.ggml_bin_tensors` reads it: 11 hyperparameters, the
#: mel filter bank, the vocabulary.
WHISPER_HEADER = (("i32", 11), ("f32", 2), ("strings",))
#: What its converter reads of the checkpoint directory beyond what transformers loads.
CONVERTER_READS = ("vocab.json", "added_tokens.json", "config.json")


#: Its converter's names of a layer's tensors (``conv_map`` of ``models/convert-h5-to-ggml.py``:
#: OpenAI's), by transformers' (the checkpoint's, less ``model.``).
LAYER_NAMES = {"self_attn.q_proj": "attn.query", "self_attn.k_proj": "attn.key",
               "self_attn.v_proj": "attn.value", "self_attn.out_proj": "attn.out",
               "self_attn_layer_norm": "attn_ln", "encoder_attn.q_proj": "cross_attn.query",
               "encoder_attn.k_proj": "cross_attn.key", "encoder_attn.v_proj": "cross_attn.value",
               "encoder_attn.out_proj": "cross_attn.out",
               "encoder_attn_layer_norm": "cross_attn_ln", "fc1": "mlp.0", "fc2": "mlp.2",
               "final_layer_norm": "mlp_ln"}
#: Its names of the other tensors, by transformers'.
OTHER_NAMES = {"encoder.layer_norm.weight": "encoder.ln_post.weight",
               "encoder.layer_norm.bias": "encoder.ln_post.bias",
               "encoder.embed_positions.weight": "encoder.positional_embedding",
               "decoder.layer_norm.weight": "decoder.ln.weight",
               "decoder.layer_norm.bias": "decoder.ln.bias",
               "decoder.embed_positions.weight": "decoder.positional_embedding",
               "decoder.embed_tokens.weight": "decoder.token_embedding.weight"}


class WhisperCppWhisper(Adapter):
    name = "whisper_cpp_whisper"
    title = "whisper.cpp"
    families = ("whisper",)
    output = "f32json"
    weight_types = tuple(MODEL_FILES)
    options = (
        Option("root", ".ports/whisper_cpp", "the built port (make ports)"),
        Option("flash_attn", "on", "whisper.cpp's flash attention (whisper_context_params."
               "flash_attn; on as whisper-cli and whisper_context_default_params ship it)",
               choices=("on", "off")),
        Option("mel", "own", "the log-mel its teacher-forced logits encode: its own of the "
               "audio (whisper_pcm_to_mel), or the reference's mel_features (whisper_set_mel), "
               "which takes its frontend out of decoder_logits; its transcript is always "
               "whisper_full's on the audio", choices=("own", "reference")),
    )
    tensors = (TensorMap("decoder_logits", "decoder_logits"),)
    printed = TensorMap(DECODE_LINE.strip(), "decode")
    converts = True
    reads_reference = True
    replays = False
    port = PORT
    # whisper-quantize's to_skip: 2-D, kept as converted by name
    unquantized = (r"encoder\.conv[12]\.bias", r"(en|de)coder\.positional_embedding")
    weights = (*(WeightName(f"{side}.blocks.{{i}}.{ours}.{part}",
                            f"{side}.layers.{{i}}.{theirs}.{part}")
                 for side in ("encoder", "decoder") for theirs, ours in LAYER_NAMES.items()
                 for part in ("weight", "bias")),
               *(WeightName(ours, theirs) for theirs, ours in OTHER_NAMES.items()))
    notes = ("whisper.cpp's C API returns no activation (its state is opaque, its graphs have no "
             "eval callback): its transcript (whisper_full) and the logits of each decoded "
             "token (whisper_get_logits), teacher-forced one cached step at a time along the "
             "reference's prompt and ids, are compared",)

    def unavailable(self, stage: str) -> str | None:
        """Every stage but its logits and its decode: whisper.h returns no activation."""
        return ("whisper.cpp does not expose it: whisper.h returns the logits of the last "
                "decoded token and whisper_full's tokens, no activation (the mel, the encoder "
                "and the decoder layers stay inside its opaque state)")

    def convert(self, model: Path, weight_type: str, output: Path, *,
                options: Mapping[str, Any]) -> list[list[str]]:
        """Its converter, ``convert-h5-to-ggml.py <checkpoint> <openai-whisper tree> <output>``:
        with a fourth argument (any) it writes f32, without it f16 (biases, norms, the conv
        biases and both position tables f32); a quantized type is ``whisper-quantize`` of the
        f16 file, as whisper.cpp's README makes them (its loader wants the conv kernels f16 in
        every type but f32, which quantizing the f32 file would leave f32), with the type's
        ftype name (``q4_k``).

        Raises:
            AudioparityError: the checkpoint lacks a file the converter reads.
        """
        lacking = [name for name in CONVERTER_READS if not (Path(model) / name).is_file()]
        if lacking:
            raise AudioparityError(f"{model}: no {', '.join(lacking)}; whisper.cpp's converter "
                                   "reads them from a transformers Whisper checkpoint directory")
        root = self.root(options)
        base = "f32" if weight_type == "f32" else "f16"
        commands = [[sys.executable, str(root / "models" / "convert-h5-to-ggml.py"), str(model),
                     str(root / "openai-whisper"), str(output),
                     *(["use-f32"] if base == "f32" else [])]]
        if weight_type != base:
            commands.append([str(root / "build" / "bin" / "whisper-quantize"),
                             str(Path(output) / MODEL_FILES[base]),
                             str(Path(output) / MODEL_FILES[weight_type]),
                             weight_type.lower()])
        return commands

    def model_files(self, model: Path, options: Mapping[str, Any], weight_type: str
                    ) -> list[Path]:
        """The ``.bin`` its run reads."""
        return [Path(model) / MODEL_FILES[weight_type]]

    def model_tensors(self, path: Path) -> list:
        """The tensors of its legacy ggml ``.bin`` (:data:`WHISPER_HEADER`)."""
        return ggml_bin_tensors(path, WHISPER_HEADER)

    def prepare(self, reference: Path | None, folder: Path, *, options: Mapping[str, Any]
                ) -> Path:
        """The teacher-forced tokens, the reference's decoder prompt (its manifest's
        ``decoder_prompt``) then its decoded ids, as the raw int32 file the driver reads, in
        the new folder ``folder``; with the option ``mel`` ``reference``, also the reference's
        ``mel_features`` ``[T, n_mels]`` as the raw float32 ``[n_mels, T]`` whisper_set_mel
        takes.

        Raises:
            AudioparityError: the reference dump is not ``ok`` or lacks its decode, its prompt
                or (``mel`` ``reference``) its mel_features.
        """
        from audioparity.dumping.artifacts import Dump

        dump = Dump(reference)
        decode, mel = self.printed.stage, REFERENCE_MEL.stage
        needs = [decode, *([mel] if options["mel"] == "reference" else [])]
        prompt = dump.manifest.get("decoder_prompt")
        if (dump.status != "ok" or not all(map(dump.has, needs))
                or not isinstance(prompt, list)):
            raise AudioparityError(f"{reference}: expected a Whisper reference dump of status "
                                   f"ok with its {', '.join(needs)} and decoder_prompt")
        folder.mkdir(parents=True)
        np.asarray([*prompt, *dump.json(decode)["ids"]], dtype="<i4").tofile(folder / TOKENS)
        if options["mel"] == "reference":
            np.ascontiguousarray(dump.tensor(mel).T, dtype="<f4").tofile(
                folder / REFERENCE_MEL.source)
        return folder

    def run(self, call: ToolCall) -> list[Command]:
        """The driver on the converted model, the case's audio and the prepared tokens; its
        transcript in the family's language (``en`` or ``<|en|>``; English for an English-only
        model, whose prompt has none) and task."""
        language = call.family_options["language"].removeprefix("<|").removesuffix("|>") or "en"
        return [([str(self.root(call.options) / "build" / "bin" / "whisper-cpp-dump"), "--model",
                  str(Path(call.model) / MODEL_FILES[call.weight_type]), "--audio", str(call.case),
                  "--tokens", str(call.reference / TOKENS), "--output-dir", str(call.output),
                  "--threads", str(call.threads), "--flash-attn", call.options["flash_attn"],
                  "--language", language, "--task", call.family_options["task"],
                  *(["--mel", str(call.reference / REFERENCE_MEL.source)]
                    if call.options["mel"] == "reference" else [])],
                 {})]

    def parse(self, stdout: str, stderr: str, model: Path | None, *,
              options: Mapping[str, Any]) -> dict:
        """The decode ``{ids, text}`` of the driver's ``decode:`` line: whisper_full's text
        tokens (below ``<|endoftext|>``) and its segments' text, as whisper.cpp joins its
        tokens' bytes (the tokenizer's decode with special tokens skipped, leading space kept).

        Raises:
            AudioparityError: no such line, or several, or one that is not ``{ids, text}``.
        """
        lines = [line[len(DECODE_LINE):] for line in stdout.splitlines()
                 if line.startswith(DECODE_LINE)]
        if len(lines) != 1:
            raise AudioparityError(f"whisper-cpp-dump printed {len(lines)} '{DECODE_LINE}' "
                                   "lines; expected one")
        try:
            document = json.loads(lines[0])
        except json.JSONDecodeError as err:
            raise AudioparityError(f"whisper-cpp-dump's decode line is not JSON: {err}") from None
        if (not isinstance(document, dict) or set(document) != {"ids", "text"}
                or not isinstance(document["text"], str) or not isinstance(document["ids"], list)
                or not all(isinstance(i, int) for i in document["ids"])):
            raise AudioparityError("whisper-cpp-dump's decode line is not {ids: [int], text: "
                                   f"str}}: {lines[0][:80]}")
        return document
