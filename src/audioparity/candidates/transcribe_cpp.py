"""transcribe.cpp (handy-computer/transcribe.cpp, MIT; ggml 0.20.2 vendored) as a Parakeet-TDT
candidate: its own converter (``scripts/convert-parakeet.py``, which picks a variant profile by
the output folder's name and checks the tokenizer's size against it) and quantizer, then
``transcribe-cli`` with ``TRANSCRIBE_DUMP_DIR``: every tensor it computes, as ``.f32`` +
``.json`` files, and the decode it prints with ``--timestamps token``."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audioparity.candidates.adapter import (
    VULKAN_MARK,
    Adapter,
    Command,
    Port,
    TensorMap,
    ToolCall,
    WeightName,
)
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import Option
from audioparity.models.registry import spec_of

#: Seconds per encoder frame of Parakeet (hop 10 ms x subsampling 8): its token times' unit.
FRAME_SECONDS = 0.08
#: A token line of ``--timestamps token``: ``[ t0 ->  t1] p=0.529 <piece text>``.
TOKEN_LINE = re.compile(r"^\s*\[\s*([\d.]+)\s*->\s*([\d.]+)\]\s+p=[\d.]+ (.*)$")
#: The preset of ``transcribe-quantize`` (``tools/transcribe-quantize/policy.cpp``) that makes
#: each weight type. The uniform ones store every linear weight (and the decoder's embedding)
#: at the type; the 1x1 pointwise convolutions stay f16, the other kernels, norms and biases
#: f32. It has no uniform k-quant below q6_K: its ``Q5_K_M`` and ``Q4_K_M`` are mixes (weight
#: types q5_K_M and q4_K_M), which store the attention output projections q8_0 and the
#: embedding q6_K. Rows that do not fill a block fall back: q8_0 for a k-quant, f16 for the
#: others.
PRESETS = {"f16": "F16", "q8_0": "Q8_0", "q6_K": "Q6_K", "q5_1": "Q5_1", "q5_0": "Q5_0",
           "q5_K_M": "Q5_K_M", "q4_1": "Q4_1", "q4_0": "Q4_0", "q4_K_M": "Q4_K_M"}


#: Its converter's names of an encoder block's tensors (``ENCODER_BLOCK_TABLE`` and the tables
#: after it in ``scripts/convert-parakeet.py``), by the checkpoint's: a plain rename, each
#: tensor in NeMo's layout; the LSTM's two biases are summed into one, which no weight is.
BLOCK_NAMES = {
    "norm_feed_forward1": "norm_ff1", "feed_forward1.linear1": "ff1.linear1",
    "feed_forward1.linear2": "ff1.linear2", "norm_self_att": "norm_attn",
    "self_attn.linear_q": "attn.linear_q", "self_attn.linear_k": "attn.linear_k",
    "self_attn.linear_v": "attn.linear_v", "self_attn.linear_out": "attn.linear_out",
    "self_attn.linear_pos": "attn.linear_pos", "norm_conv": "norm_conv",
    "conv.pointwise_conv1": "conv.pointwise1", "conv.depthwise_conv": "conv.depthwise",
    "conv.pointwise_conv2": "conv.pointwise2", "conv.batch_norm": "conv.bn",
    "norm_feed_forward2": "norm_ff2", "feed_forward2.linear1": "ff2.linear1",
    "feed_forward2.linear2": "ff2.linear2", "norm_out": "norm_out"}
#: Its names of the other tensors, by the checkpoint's.
OTHER_NAMES = {
    "encoder.pre_encode.conv.{i}": "enc.pre_encode.conv.{i}",
    "encoder.pre_encode.out": "enc.pre_encode.out",
    "decoder.prediction.embed": "pred.embed", "joint.enc": "joint.enc",
    "joint.pred": "joint.pred", "joint.joint_net.2": "joint.out",
    "decoder.decoder_layers.0": "head.ctc"}


def _weight_names() -> tuple[WeightName, ...]:
    """Its weight map (:class:`WeightName`) from :data:`BLOCK_NAMES` and :data:`OTHER_NAMES`."""
    names = [WeightName(f"enc.blocks.{{i}}.{ours}.{part}", f"encoder.layers.{{i}}.{nemo}.{part}")
             for nemo, ours in BLOCK_NAMES.items()
             for part in ("weight", "bias", "running_mean", "running_var")]
    names += [WeightName(f"enc.blocks.{{i}}.attn.pos_bias_{k}", f"encoder.layers.{{i}}.self_attn."
                         f"pos_bias_{k}") for k in "uv"]
    names += [WeightName(f"{ours}.{part}", f"{nemo}.{part}") for nemo, ours in OTHER_NAMES.items()
              for part in ("weight", "bias")]
    names += [WeightName(f"pred.lstm.{{i}}.W{x}", f"decoder.prediction.dec_rnn.lstm.weight_{y}"
                         "_l{i}") for x, y in (("x", "ih"), ("h", "hh"))]
    return tuple(names)


class TranscribeCpp(Adapter):
    name = "transcribe_cpp"
    title = "transcribe.cpp"
    families = ("parakeet_tdt",)
    output = "f32json"
    weight_types = ("f32", *PRESETS)
    backends = ("cpu", "vulkan")
    options = (
        Option("root", ".ports/transcribe_cpp", "the built port (make ports)"),
        Option("profile", "parakeet-tdt-0.6b-v2", "the converter's variant profile, picked by "
               "the name of the folder the model is converted into (its vocabulary size must "
               "match: 1024 for v2, 8192 for v3)"),
    )
    tensors = (
        TensorMap("enc.mel.in", "mel_features", layout="[n_mels, T]", drop_frames=1,
                  why="transcribe.cpp keeps the frame NeMo pads and zeroes: L//hop + 1 frames, "
                      "NeMo's valid ones are L//hop"),
        TensorMap("enc.pre_encode.out", "pre_encode"),
        TensorMap("enc.pos_emb", "pos_emb"),
        TensorMap("enc.block.{i}.out", "layer_{i}"),
        TensorMap("enc.final", "enc_out"),
        TensorMap("dec.joint.0", "joint_logits", view=(("row", 0), ("log_softmax",)),
                  why="transcribe.cpp dumps the first joint step only, log-softmaxed over "
                      "tokens and durations together"),
        TensorMap(("dec.lstm.{i}.h.0", "dec.lstm.{i}.c.0"), "lstm_state_0"),
    )
    printed = TensorMap("tokens:", "decode")
    unmapped = ("enc.block.{i}.attn", "enc.block.{i}.conv", "enc.block.{i}.ff1",
                "enc.block.{i}.ff2", "dec.embed.{i}", "dec.enc_out")
    converts = True
    # 2-D, yet its quantizer keeps them f32 by name (its Norm bucket)
    unquantized = (r".*\.pos_bias_[uv]",)
    weights = _weight_names()
    port = Port(
        archive="transcribe.cpp-*.tar.gz",
        commands=(
            ("cmake", "-B", "build", "-DCMAKE_BUILD_TYPE=Release", "-DTRANSCRIBE_BUILD_TESTS=OFF",
             "-DTRANSCRIBE_ENABLE_VALIDATION_HOOKS=ON", "-DTRANSCRIBE_USE_SYSTEM_BLAS=OFF",
             "-DTRANSCRIBE_BUILD_TOOLS=ON"),
            ("cmake", "--build", "build", "-j{jobs}", "--target", "transcribe-cli",
             "transcribe-quantize"),
        ),
        products=("build/bin/transcribe-cli", "build/bin/transcribe-quantize",
                  "scripts/convert-parakeet.py"),
        vulkan=("-DTRANSCRIBE_VULKAN=ON",),
        # its vendored ggml (0.20.2) names VK_EXT_layer_settings, which Debian 12's Vulkan
        # headers (1.3.239) lack: the one use is guarded, as for ggml-python (make setup-vulkan)
        vulkan_patch="transcribe.cpp-vulkan-headers.patch",
    )
    notes = ("decode: transcribe-cli prints each token's piece and times, not its id; the ids "
             "are the pieces' ids in the model's own vocabulary (tokenizer.ggml.tokens)",)

    def unavailable(self, stage: str) -> str | None:
        """As :meth:`Adapter.unavailable`; a stage along the reference's greedy path
        (:attr:`~audioparity.contract.spec.Stage.reference_path`) that it did not write (the
        decode teacher-forced on its own encoder output) needs that path fed to its decoder, which
        runs free."""
        if spec_of(self.families[0]).on_reference_path(stage):
            return (f"{self.title} does not expose it: its decoder runs free (it dumps the "
                    "first joint step of its own decode only) and takes no given path")
        return super().unavailable(stage)

    def _gguf(self, model_dir: Path, options: Mapping[str, Any], weight_type: str) -> Path:
        return Path(model_dir) / "models" / options["profile"] / f"model-{weight_type}.gguf"

    def convert(self, model: Path, weight_type: str, output: Path, *,
                options: Mapping[str, Any]) -> list[list[str]]:
        """``convert-parakeet.py`` into ``output/models/<profile>/model-f32.gguf``, then for
        another weight type ``transcribe-quantize`` with its preset (:data:`PRESETS`)."""
        root = self.root(options)
        f32 = self._gguf(output, options, "f32")
        f32.parent.mkdir(parents=True, exist_ok=True)
        commands = [[sys.executable, str(root / "scripts" / "convert-parakeet.py"), str(model),
                     str(f32)]]
        if weight_type != "f32":
            commands.append([str(root / "build" / "bin" / "transcribe-quantize"), str(f32),
                             str(self._gguf(output, options, weight_type)), "--quant",
                             PRESETS[weight_type]])
        return commands

    def model_files(self, model: Path, options: Mapping[str, Any], weight_type: str
                    ) -> list[Path]:
        """The GGUF its run reads."""
        return [self._gguf(model, options, weight_type)]

    def cannot_run(self, options: Mapping[str, Any], weight_type: str, backend: str
                   ) -> str | None:
        """As :meth:`Adapter.cannot_run` (a uniform k-quant it has only as a mix, saying so), and
        Vulkan needs the build ``make ports`` makes after ``make setup-vulkan`` at the option
        ``root``."""
        why = super().cannot_run(options, weight_type, backend)
        if f"{weight_type}_M" in PRESETS:
            why = (f"transcribe.cpp has no uniform {weight_type}: its preset "
                   f"{PRESETS[weight_type + '_M']} is the mix {weight_type}_M")
        root = self.root(options)
        if not why and backend == "vulkan" and not (root / VULKAN_MARK).is_file():
            why = (f"transcribe.cpp at {root} is built without Vulkan (make setup-vulkan, then "
                   "make ports; the Vulkan build is .ports/transcribe_cpp-vulkan)")
        return why

    def run(self, call: ToolCall) -> list[Command]:
        """``transcribe-cli`` on the converted model, every tensor dumped into ``output``."""
        return [([str(self.root(call.options) / "build" / "bin" / "transcribe-cli"),
                  "-m", str(self._gguf(call.model, call.options, call.weight_type)),
                  "--threads", str(call.threads), "--backend", call.backend,
                  "--timestamps", "token", "-q", str(call.case)],
                 {"TRANSCRIBE_DUMP_DIR": str(call.output), "TRANSCRIBE_DUMP_ALL_BLOCKS": "1"})]

    def parse(self, stdout: str, stderr: str, model: Path | None, *,
              options: Mapping[str, Any]) -> dict:
        """The decode of ``--timestamps token``'s lines: frames and durations from the times
        (80 ms an encoder frame), ids from the pieces through the vocabulary of the converted
        ``model`` (without a model, each id is None).

        Raises:
            AudioparityError: no ``tokens:`` list, or a piece the vocabulary does not hold (or
                holds twice).
        """
        lines = stdout.splitlines()
        listed = next((k for k, line in enumerate(lines) if line.startswith("tokens:")), None)
        if listed is None:
            raise AudioparityError("transcribe-cli printed no 'tokens:' list")
        text = next((line.removeprefix("text: ") for line in lines
                     if line.startswith("text: ")), "")
        by_text = (_pieces(next(Path(model).glob("models/*/model-f32.gguf")))
                   if model is not None else None)
        ids, frames, durations = [], [], []
        for line in lines[listed + 1:]:
            found = TOKEN_LINE.match(line)
            if not found:
                break
            t0, t1, piece = float(found.group(1)), float(found.group(2)), found.group(3)
            matches = by_text.get(piece, []) if by_text is not None else [None]
            if len(matches) != 1:
                raise AudioparityError(f"transcribe-cli token {piece!r}: {len(matches)} pieces "
                                       "of the vocabulary print so; expected one")
            ids.append(matches[0])
            frames.append(round(t0 / FRAME_SECONDS))
            durations.append(round((t1 - t0) / FRAME_SECONDS))
        return {"ids": ids, "frames": frames, "durations": durations,
                "text": "" if text == "(empty)" else text}


def _pieces(gguf_file: Path) -> dict[str, list[int]]:
    """The ids of each piece of a GGUF file's vocabulary (``tokenizer.ggml.tokens``), by the
    text transcribe-cli prints for it (``▁`` as a space)."""
    import gguf

    field = gguf.GGUFReader(str(gguf_file)).fields["tokenizer.ggml.tokens"]
    by_text: dict[str, list[int]] = {}
    for index, part in enumerate(field.data):
        piece = bytes(field.parts[part]).decode("utf-8")
        by_text.setdefault(piece.replace("\u2581", " "), []).append(index)
    return by_text
