"""A Parakeet-TDT dump tool with the command line and files of the seed ``dump_cpp_reference``
(audio.cpp, ``../shared/seeds/parakeet_dump_cpp_reference.cpp.txt``): ``mel_features.npy``,
``enc_out.npy``, an isolated ``layer_0.npy`` fed NeMo's ``pre_encode``/``pos_emb`` from
``--nemo-dir`` (rank 3, written by :meth:`ParakeetDumpCpp.prepare`), and with
``--decoder-input`` a replay of the reference's ``enc_out`` through its decoder into
``decoder_tokens.json``.

Option ``binary``: the tool's command line, split as a shell would (:func:`shlex.split`), so it
may hold an interpreter and a script (``python3 tests/standins/parakeet_dump_cpp.py``); the
seed's flags are appended to it. The tool runs single-threaded (the seed fixes 1 thread).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from audioparity.candidates.adapter import Adapter, Command, TensorMap, ToolCall
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import Option
from audioparity.models.registry import spec_of


class ParakeetDumpCpp(Adapter):
    name = "parakeet_dump_cpp"
    title = "dump_cpp_reference (audio.cpp's Parakeet-TDT parity dumper)"
    families = ("parakeet_tdt",)
    output = "npy"
    # The seed's usage names native|f16|bf16|q8_0; its parser (audio.cpp's
    # parse_tensor_storage_type) takes f32 too, as its Parakeet sessions do.
    weight_types = ("native", "f32", "f16", "bf16", "q8_0")
    backends = ("cpu", "cuda", "vulkan")
    options = (Option("binary", "", "the tool's command line (shell-split: it may start with "
                      "an interpreter); the seed's flags are appended"),)
    tensors = (
        TensorMap("mel_features", "mel_features"),
        TensorMap("enc_out", "enc_out"),
        TensorMap("layer_0", "layer_0_isolated"),
        TensorMap("decoder_tokens", "decoder_replay", omits=("text",),
                  why="the tool's decoder_tokens.json holds ids, frames and durations, no text"),
    )
    reads_reference = True
    notes = ("layer_0 is layer 0 alone on NeMo's pre_encode and pos_emb (the isolated form); "
             "decoder_tokens.json is the decoder on NeMo's enc_out (decoder_replay)",
             "mel_features: the seed's frontend may keep the frame NeMo pads (L//hop + 1 "
             "frames); the stage then reports the frame counts and compares the common ones")

    def unavailable(self, stage: str) -> str | None:
        """As :meth:`Adapter.unavailable`; a stage along the reference's greedy path
        (:attr:`~audioparity.contract.spec.Stage.reference_path`) needs that path fed to its
        decoder, which runs free (``decoder_tokens.json``) and writes no joint logits."""
        if spec_of(self.families[0]).on_reference_path(stage):
            return (f"{self.title} does not expose it: its decoder runs free and writes no "
                    "joint logits")
        return super().unavailable(stage)

    def files(self, options: Mapping[str, Any]) -> list[str]:
        """The files of the ``binary`` command line (its words naming a path: the tool, or the
        script an interpreter runs): rebuilding the tool reruns its cells."""
        return [word for word in _binary(options) if "/" in word]

    def prepare(self, reference: Path | None, folder: Path, *, options: Mapping[str, Any]
                ) -> Path:
        """The tool's ``--nemo-dir`` (and ``--decoder-input``) files from the reference dump,
        into the new folder ``folder``: ``pre_encode.npy`` ``[1, T, D]``, ``pos_emb.npy``
        ``[1, 2T-1, D]``, ``enc_out.npy`` ``[T, D]`` (the same files ``audioparity export
        --format seed`` writes).

        Raises:
            AudioparityError: the reference dump is not a Parakeet-TDT dump of status ``ok``
                holding those tensors.
        """
        from audioparity.dumping.export import export_dump

        export_dump(reference, "seed", folder, family="parakeet_tdt")
        return folder

    def run(self, call: ToolCall) -> list[Command]:
        """Two runs of the tool writing into ``output``: the main one (``mel_features.npy``,
        ``enc_out.npy``, ``layer_0.npy``; ``--nemo-dir`` is ``reference``, the folder
        :meth:`prepare` wrote), then the decoder replay of the reference's ``enc_out``
        (``--decoder-input``, ``decoder_tokens.json``). ``--flash-attention`` is the family
        option ``flash_attention`` (0 when not given); ``threads`` is not passed (the tool runs
        one thread).

        Raises:
            AudioparityError: the ``binary`` option is empty or unsplittable.
        """
        prepared = Path(call.reference)
        common = [*_binary(call.options), "--model", str(call.model), "--audio", str(call.case),
                  "--output-dir", str(call.output), "--matmul-weight-type", call.weight_type,
                  "--backend", call.backend, "--flash-attention",
                  str(int(call.family_options.get("flash_attention", 0)))]
        return [([*common, "--nemo-dir", str(prepared)], {}),
                ([*common, "--decoder-input", str(prepared / "enc_out.npy")], {})]


def _binary(options: Mapping[str, Any]) -> list[str]:
    """The ``binary`` option as argv words.

    Raises:
        AudioparityError: empty, or not shell-splittable.
    """
    try:
        words = shlex.split(options["binary"])
    except ValueError as err:
        raise AudioparityError(f"adapter 'parakeet_dump_cpp' option 'binary' "
                               f"{options['binary']!r}: {err}") from None
    if not words:
        raise AudioparityError("adapter 'parakeet_dump_cpp': option 'binary' is empty; expected "
                               "the tool's command line")
    return words
