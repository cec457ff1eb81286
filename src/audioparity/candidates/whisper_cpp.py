"""whisper.cpp's Parakeet-TDT (ggml-org/whisper.cpp, MIT; ggml 0.21.0 vendored) as a candidate:
its converter (``models/convert-parakeet-to-ggml.py``, a legacy ggml ``.bin``) and quantizer,
then ``parakeet-cli -ps``, whose token rows (id, frame, duration) are its decode. It exposes no
tensors: only the decode is compared. Its loader wants the joint's hidden size equal to the
prediction network's, no linear biases, feed-forward x4 and dw_striding x8."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audioparity.candidates.adapter import Adapter, Command, Port, TensorMap, ToolCall, WeightName
from audioparity.candidates.model_file import ggml_bin_tensors
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import Option

#: A token row of ``-ps``: ``[ 9] id=  571 frame=  9 dur_idx= 0 dur_val= 0 ...``.
TOKEN_ROW = re.compile(r"^\s*\[\s*\d+\]\s+id=\s*(\d+)\s+frame=\s*(\d+)\s+dur_idx=\s*\d+\s+"
                       r"dur_val=\s*(\d+)\s")

#: The quantized types of its quantizers (``parakeet-quantize``, ``whisper-quantize``): the
#: ftypes of ``examples/common-ggml.cpp`` (``q4_0`` ... ``q8_0``, ``q2_k`` ... ``q6_k``), each
#: storing every 2-D tensor its tool does not skip by name at that type.
QUANTIZED = ("q8_0", "q6_K", "q5_1", "q5_0", "q5_K", "q4_1", "q4_0", "q4_K", "q3_K", "q2_K")

#: The header of its Parakeet ``.bin`` (``convert-parakeet-to-ggml.py``), as
#: :func:`~audioparity.candidates.model_file.ggml_bin_tensors` reads it: 15 hyperparameters, the
#: mel filter bank, the window, the durations (as many as hyperparameter 13,
#: ``n_tdt_durations``), the vocabulary.
PARAKEET_HEADER = (("i32", 15), ("f32", 2), ("f32", 1), ("u32", 13), ("strings",))

#: One build of the snapshot serves both of its families: Parakeet-TDT (``parakeet-cli``,
#: ``parakeet-quantize``) and Whisper (``whisper-cli``, ``whisper-quantize``, our driver of
#: ``whisper.h`` linked with its examples' audio reader, and OpenAI's mel filters, which its
#: converter ``convert-h5-to-ggml.py`` reads from an ``openai-whisper`` tree).
PORT = Port(
    archive="whisper.cpp-*.tar.gz",
    drivers=("whisper_cpp_dump.cpp",),
    assets=(("openai-whisper==20250625",
             "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96",
             "whisper/assets", "openai-whisper/whisper/assets"),),
    commands=(
        ("cmake", "-B", "build", "-DCMAKE_BUILD_TYPE=Release", "-DWHISPER_BUILD_TESTS=OFF",
         "-DWHISPER_SDL2=OFF"),
        ("cmake", "--build", "build", "-j{jobs}", "--target", "parakeet-cli",
         "parakeet-quantize", "whisper-cli", "whisper-quantize", "common"),
        ("c++", "-O2", "-std=c++17", "-Wall", "-o", "build/bin/whisper-cpp-dump",
         "drivers/whisper_cpp_dump.cpp", "-Iinclude", "-Iggml/include", "-Iexamples",
         "build/examples/libcommon.a", "-Lbuild/bin", "-lwhisper", "-lggml", "-lggml-base",
         "-lpthread", "-Wl,-rpath,$ORIGIN"),
    ),
    products=("build/bin/parakeet-cli", "build/bin/parakeet-quantize",
              "models/convert-parakeet-to-ggml.py", "build/bin/whisper-cli",
              "build/bin/whisper-quantize", "build/bin/whisper-cpp-dump",
              "models/convert-h5-to-ggml.py", "openai-whisper/whisper/assets/mel_filters.npz"),
)


class WhisperCpp(Adapter):
    name = "whisper_cpp"
    title = "whisper.cpp"
    families = ("parakeet_tdt",)
    output = "tokens"
    weight_types = ("f32", "f16", *QUANTIZED)
    options = (Option("root", ".ports/whisper_cpp", "the built port (make ports)"),)
    printed = TensorMap("-ps", "decode")
    converts = True
    # parakeet-quantize's to_skip: 2-D, kept as converted (f32) by name
    unquantized = (r"encoder\.layers\..+\.conv\.depthwise_conv\.weight",
                   r"encoder\.layers\..+\.self_attn\.pos_bias_[uv]")
    # NeMo's names, but the LSTM's rows: its converter reorders torch's gates i, f, g, o as
    # i, f, o, g (and sums the two biases into bias_h_l{i}, which no weight is)
    weights = tuple(WeightName(f"decoder.prediction.dec_rnn.lstm.weight_{kind}_l{{i}}",
                               f"decoder.prediction.dec_rnn.lstm.weight_{kind}_l{{i}}",
                               gates=(0, 1, 3, 2)) for kind in ("ih", "hh"))
    port = PORT
    replays = False
    notes = ("whisper.cpp exposes no tensors: its decode (parakeet-cli -ps) is compared",)

    def unavailable(self, stage: str) -> str | None:
        """Every stage but its decode: parakeet-cli prints its decode and nothing else."""
        return "whisper.cpp does not expose it: parakeet-cli prints only its decode (-ps)"

    def convert(self, model: Path, weight_type: str, output: Path, *,
                options: Mapping[str, Any]) -> list[list[str]]:
        """The converter: ``--use-f32`` for f32; without it for f16 (its own choice of which
        tensors stay f32: biases, norms, convolution kernels); for a quantized type, the f32
        model then ``parakeet-quantize`` with the type's ftype name (``q4_k``); its types are
        the quantized ones only, and at a k-quant it keeps the prediction and joint tensors
        f32 when the prediction width does not fill its blocks of 256."""
        root = self.root(options)
        base = "f16" if weight_type == "f16" else "f32"
        commands = [[sys.executable, str(root / "models" / "convert-parakeet-to-ggml.py"),
                     "--model", str(model), "--out-dir", str(output),
                     *(["--use-f32"] if base == "f32" else []),
                     "--out-name", _model(output, base).name]]
        if weight_type not in ("f32", "f16"):
            commands.append([str(root / "build" / "bin" / "parakeet-quantize"),
                             str(_model(output, base)), str(_model(output, weight_type)),
                             weight_type.lower()])
        return commands

    def model_files(self, model: Path, options: Mapping[str, Any], weight_type: str
                    ) -> list[Path]:
        """The ``.bin`` its run reads."""
        return [_model(model, weight_type)]

    def model_tensors(self, path: Path) -> list:
        """The tensors of its legacy ggml ``.bin`` (:data:`PARAKEET_HEADER`)."""
        return ggml_bin_tensors(path, PARAKEET_HEADER)

    def run(self, call: ToolCall) -> list[Command]:
        """``parakeet-cli -ps`` on the converted model (CPU: ``-ng``)."""
        return [([str(self.root(call.options) / "build" / "bin" / "parakeet-cli"),
                  "-m", str(_model(call.model, call.weight_type)), "-f", str(call.case), "-ps",
                  "-t", str(call.threads), *(["-ng"] if call.backend == "cpu" else [])], {})]

    def parse(self, stdout: str, stderr: str, model: Path | None, *,
              options: Mapping[str, Any]) -> dict:
        """The decode of the ``-ps`` token rows (on stderr) and the text (the first line of
        stdout).

        Raises:
            AudioparityError: no token row and no text (nothing decoded is a text of "").
        """
        rows = [row for row in map(TOKEN_ROW.match, stderr.splitlines()) if row]
        text = stdout.splitlines()[0].strip() if stdout.strip() else ""
        if not rows and text:
            raise AudioparityError("parakeet-cli printed a text but no -ps token rows")
        return {"ids": [int(r.group(1)) for r in rows],
                "frames": [int(r.group(2)) for r in rows],
                "durations": [int(r.group(3)) for r in rows], "text": text}


def _model(model_dir: Path, weight_type: str) -> Path:
    return Path(model_dir) / f"ggml-model-{weight_type}.bin"
