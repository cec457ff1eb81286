"""Every input of docs/errors.md through the real command line: the exit code, the exact one-line
message, and what is left on disk; the same message from the reference side where it applies.

Each case runs ``python -m audioparity.cli ...`` (or ``python -m snakemake``) in a subprocess, in
a folder holding the case's inputs under short relative names (``tiny.nemo``, ``ref``,
``clip.wav``, ``moss``, ``prompt.json``), so messages carry no temporary paths and the table
row the run produces must appear verbatim in docs/errors.md: the document cannot drift from the
code. ``python -m tests.test_errors`` runs every case and rewrites docs/errors.md, the
"check-dump" section from the cases of ``tests/candidates/test_check_dump.py`` (its
``DOC_CASES``, run by its ``check_row``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml

from tests import REPO

DOC = REPO / "docs" / "errors.md"
NOTHING = "nothing: no `out/`, no `out.partial/`"
#: How each command names its output; the case folder must hold nothing new after a refusal.
OUT = "out"


@dataclass(frozen=True)
class Fixtures:
    """The shared inputs a case folder links to."""

    nemo: Path  # tiny Parakeet-TDT .nemo
    ref: Path  # its NeMo reference dump of clip.wav
    clip: Path  # the project's 16 kHz mono 16-bit clip
    moss: Path  # tiny MOSS checkpoint directory
    prompt: Path  # a valid MOSS prompt
    moss_ref: Path  # its torch reference dump of the prompt

    def link_into(self, folder: Path) -> None:
        for name, target in (("tiny.nemo", self.nemo), ("ref", self.ref), ("clip.wav", self.clip),
                             ("moss", self.moss), ("prompt.json", self.prompt),
                             ("moss-ref", self.moss_ref)):
            (folder / name).symlink_to(target)


# --- building bad inputs -----------------------------------------------------------------------


def rewrite_nemo(source: Path, target: Path, replace: dict[str, bytes | None]) -> None:
    """Copy the .nemo tar ``source`` to ``target``, replacing (bytes) or dropping (None) the
    members whose names end with a key of ``replace``."""
    with tarfile.open(source) as tar_in, tarfile.open(target, "w") as tar_out:
        for member in tar_in.getmembers():
            suffix = next((s for s in replace if member.name.endswith(s)), None)
            data = tar_in.extractfile(member).read() if member.isfile() else None
            if suffix is not None:
                if replace[suffix] is None:
                    continue
                data = replace[suffix]
                member.size = len(data)
            tar_out.addfile(member, None if data is None else io.BytesIO(data))


def nemo_member(path: Path, suffix: str) -> bytes:
    with tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(suffix))
        return tar.extractfile(member).read()


def nemo_with_config(fx: Fixtures, target: Path, edit: Callable[[dict], None]) -> None:
    config = yaml.safe_load(nemo_member(fx.nemo, "model_config.yaml"))
    edit(config)
    rewrite_nemo(fx.nemo, target, {"model_config.yaml": yaml.safe_dump(config).encode()})


def nemo_with_nan(fx: Fixtures, target: Path) -> None:
    import torch

    state = torch.load(io.BytesIO(nemo_member(fx.nemo, "model_weights.ckpt")),
                       map_location="cpu", weights_only=True)
    weight = state["encoder.layers.1.feed_forward1.linear1.weight"]
    weight[0, 0], weight[0, 1] = float("nan"), float("inf")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    rewrite_nemo(fx.nemo, target, {"model_weights.ckpt": buffer.getvalue()})


def hf_directory_missing_a_tensor(target: Path) -> None:
    """A small random transformers ``ParakeetForTDT`` (2 layers) saved, less one tensor."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    config = transformers.ParakeetTDTConfig(
        vocab_size=33, decoder_hidden_size=24, num_decoder_layers=1, durations=[0, 1, 2],
        encoder_config={
            "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 192, "conv_kernel_size": 9, "subsampling_factor": 8,
            "subsampling_conv_channels": 16, "num_mel_bins": 128, "scale_input": False,
        },
    )
    torch.manual_seed(0)
    transformers.ParakeetForTDT(config).save_pretrained(target)
    state = load_file(target / "model.safetensors")
    del state["encoder.layers.1.self_attn.relative_k_proj.weight"]
    save_file(state, target / "model.safetensors")


def moss_copy(fx: Fixtures, target: Path, config: Callable[[dict], None] | None = None,
              tensors: Callable[[dict], None] | None = None) -> None:
    """Copy the tiny MOSS checkpoint to ``target``, editing config.json and/or the weights."""
    shutil.copytree(fx.moss, target)
    if config is not None:
        raw = json.loads((target / "config.json").read_text())
        config(raw)
        (target / "config.json").write_text(json.dumps(raw))
    if tensors is not None:
        from safetensors.torch import load_file, save_file

        state = load_file(target / "model.safetensors")
        tensors(state)
        save_file(state, target / "model.safetensors")


def moss_nan(state: dict) -> None:
    state["language_model.layers.0.mlp.up_proj.weight"][3, 5] = float("nan")


def weights_of_tiny(weight_type: str, other_model: str | None = None
                    ) -> Callable[[Path, Fixtures], None]:
    """The tiny model's weights converted at ``weight_type`` (``<type>.gguf``), and with
    ``other_model`` a copy of the model holding one more file (another model)."""

    def make(cwd: Path, fx: Fixtures) -> None:
        from audioparity.dumping.driver import save_weights
        from audioparity.models.registry import family

        save_weights(family("parakeet_tdt"), fx.nemo, cwd / f"{weight_type}.gguf",
                     weight_type=weight_type, options={"conv_weight_type": "f32"})
        if other_model:
            shutil.copy(fx.nemo, cwd / other_model)
            with tarfile.open(cwd / other_model, "a") as tar:
                info = tarfile.TarInfo("./notes.txt")
                info.size = 5
                tar.addfile(info, io.BytesIO(b"notes"))

    return make


def long_clip(seconds: float) -> Callable[[Path, Fixtures], None]:
    """``long.wav``: the clip tiled to ``seconds``."""

    def make(cwd: Path, fx: Fixtures) -> None:
        samples = clip_samples(fx)
        write_wav(cwd / "long.wav", np.tile(samples, int(seconds * 16000) // len(samples) + 1)
                  [: int(seconds * 16000)])

    return make


def clip_samples(fx: Fixtures) -> np.ndarray:
    return sf.read(fx.clip, dtype="float64")[0]


def write_wav(path: Path, samples: np.ndarray, rate: int = 16000, subtype: str = "PCM_16") -> None:
    sf.write(path, samples, rate, subtype=subtype, format="WAV")


def file_bytes(data: bytes) -> Callable[[Path, Fixtures], None]:
    return lambda cwd, fx: (cwd / "bad").write_bytes(data)


# --- the cases ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One row of docs/errors.md: every command refuses the input with the same line."""

    id: str
    section: str
    input: str
    commands: tuple[str, ...]
    make: Callable[[Path, Fixtures], None] = lambda cwd, fx: None
    exit_code: int = 1
    slow: bool = False


@dataclass(frozen=True)
class Accepted:
    """A row of inputs that work: every command succeeds and records the same note, beginning
    with ``note_start``, in its log and in its manifest's notes."""

    id: str
    input: str
    commands: tuple[str, ...]
    make: Callable[[Path, Fixtures], None]
    note_start: str
    slow: bool = False
    check: Callable[[dict], bool] = field(default=lambda manifest: True)


#: resources/speech/clip.wav: a 44-byte RIFF header, then 16-bit mono samples.
CLIP_HEADER_BYTES = 44
#: Frames left in the WAV whose data is cut short.
CUT_FRAMES = 25_000

GGML = ("audioparity ggml parakeet-tdt --model {model} --audio {audio} --reference-dir ref "
        "--output-dir out")
REFERENCE = "audioparity reference parakeet-tdt --model {model} --audio {audio} --output-dir out"


def parakeet(model: str = "tiny.nemo", audio: str = "clip.wav", ggml_only: bool = False
             ) -> tuple[str, ...]:
    commands = (GGML.format(model=model, audio=audio),)
    return commands if ggml_only else (*commands, REFERENCE.format(model=model, audio=audio))


def moss(prompt: str = "prompt.json", model: str = "moss") -> tuple[str, ...]:
    return (f"audioparity ggml moss-voicegen --model {model} --prompt {prompt} --reference-dir "
            "moss-ref --output-dir out --weight-type f32",
            f"audioparity reference moss-voicegen --model {model} --prompt {prompt} "
            "--output-dir out")


def prompt_file(content: str) -> Callable[[Path, Fixtures], None]:
    return lambda cwd, fx: (cwd / "bad.json").write_text(content, encoding="utf-8")


def small_dump(path: Path, shape: tuple[int, ...], layout: str) -> None:
    from audioparity.dumping.artifacts import DumpWriter

    with DumpWriter(path, producer="test") as writer:
        writer.add_tensor("enc_out", np.ones(shape, np.float32), layout)


def manifest_not_json(cwd: Path, fx: Fixtures) -> None:
    small_dump(cwd / "ref_small", (4, 3), "[T, D]")
    (cwd / "cand").mkdir()
    (cwd / "cand" / "manifest.json").write_text("{")


def truncated_npy(cwd: Path, fx: Fixtures) -> None:
    small_dump(cwd / "ref_small", (4, 3), "[T, D]")
    shutil.copytree(cwd / "ref_small", cwd / "cand")
    data = (cwd / "cand" / "enc_out.npy").read_bytes()
    (cwd / "cand" / "enc_out.npy").write_bytes(data[:-5])


def returned_from_an_older_sweep(cwd: Path, fx: Fixtures) -> None:
    """A bundle's returned folder whose results were computed from a sweep.yaml that has
    changed since."""
    (cwd / "sweep.yaml").write_text("families: [parakeet_tdt]\n")
    (cwd / "returned").mkdir()
    (cwd / "returned" / "bundle.json").write_text(json.dumps({
        "packed": "2026-01-01T00:00:00+0000", "backends": ["cuda"], "targets": [],
        "files": {"sweep.yaml": hashlib.sha256(b"families: [whisper]\n").hexdigest()}}))


GATES = "'{\"gates\": [{\"stage\": \"*\", \"from\": \"default\", \"cosine_min\": 0.99}]}'"
CHECK = "audioparity report check results/report/summary.csv"


def finished_run(cwd: Path, state: str, newer_cell: bool = False) -> None:
    """A run's report folder as the workflow leaves it: its summary, the list of its one cell,
    the run state ``state``; with ``newer_cell``, the cell written after the summary."""
    from audioparity.compare.cell import COLUMNS

    cell = cwd / "results/compare/cell.json"
    cell.parent.mkdir(parents=True)
    cell.write_text("[]\n")
    report = cwd / "results/report"
    report.mkdir(parents=True)
    (report / "cells.txt").write_text("results/compare/cell.json\n")
    (report / "summary.csv").write_text(",".join(COLUMNS) + "\n")
    (report / "run.json").write_text(state)
    os.utime(cell, (2_000_000, 2_000_000) if newer_cell else (1_000_000, 1_000_000))
    os.utime(report / "summary.csv", (1_500_000, 1_500_000))

COMPARE = (f"audioparity compare --reference ref_small --candidate cand --gates {GATES} "
           "--output out")


CASES = (
    # model path and .nemo archive (both sides read it with the same code before NeMo)
    Case("model_missing", "model", "model path that does not exist", parakeet("missing.nemo")),
    Case("model_fifo", "model", "model path that is not a regular file (a FIFO)",
         parakeet("fifo.nemo"), lambda cwd, fx: os.mkfifo(cwd / "fifo.nemo")),
    Case("model_dir_without_config", "model", "model directory without config.json",
         parakeet("empty_dir", ggml_only=True), lambda cwd, fx: (cwd / "empty_dir").mkdir()),
    Case("reference_given_a_directory", "model",
         "a Hugging Face directory given to the NeMo reference (it restores .nemo files only)",
         (REFERENCE.format(model="hf_dir", audio="clip.wav"),),
         lambda cwd, fx: ((cwd / "hf_dir").mkdir(), (cwd / "hf_dir" / "config.json").write_text(
             '{"model_type": "parakeet_tdt", "encoder_config": {}}'))),
    Case("nemo_not_tar", "model", ".nemo that is not a tar", parakeet("bad"),
         file_bytes(b"not a tar archive\n" * 64)),
    Case("nemo_truncated", "model", ".nemo truncated to half its size", parakeet("half.nemo"),
         lambda cwd, fx: (cwd / "half.nemo").write_bytes(
             fx.nemo.read_bytes()[: fx.nemo.stat().st_size // 2])),
    Case("nemo_without_config", "model", ".nemo lacking model_config.yaml",
         parakeet("no_config.nemo"),
         lambda cwd, fx: rewrite_nemo(fx.nemo, cwd / "no_config.nemo",
                                      {"model_config.yaml": None})),
    Case("nemo_without_weights", "model", ".nemo lacking model_weights.ckpt",
         parakeet("no_weights.nemo"),
         lambda cwd, fx: rewrite_nemo(fx.nemo, cwd / "no_weights.nemo",
                                      {"model_weights.ckpt": None})),
    Case("nemo_shapes_disagree", "model",
         "weights whose shapes disagree with the config (`ff_expansion_factor` 4 -> 2)",
         parakeet("ff2.nemo"),
         lambda cwd, fx: nemo_with_config(
             fx, cwd / "ff2.nemo", lambda c: c["encoder"].update(ff_expansion_factor=2))),
    Case("nemo_unsupported_setting", "model",
         "a setting NeMo builds and the port does not follow (`encoder.reduction: pooling`; "
         "every such setting: docs/parakeet-settings.md)", parakeet("pooling.nemo",
                                                                    ggml_only=True),
         lambda cwd, fx: nemo_with_config(fx, cwd / "pooling.nemo", lambda c: c["encoder"].update(
             reduction="pooling", reduction_position=0, reduction_factor=2))),
    Case("nemo_nan_weight", "model", "weights holding a NaN and an Inf", parakeet("nan.nemo"),
         lambda cwd, fx: nemo_with_nan(fx, cwd / "nan.nemo")),
    Case("weights_of_another_type", "model", "converted weights file of another weight type "
         "than the dump's (`audioparity weights ... --weight-type q8_0`)",
         (GGML.format(model="tiny.nemo", audio="clip.wav")
          + " --weight-type f16 --weights-file q8_0.gguf",), weights_of_tiny("q8_0")),
    Case("weights_of_another_model", "model", "converted weights file of another model (the "
         "model's bytes changed since)",
         (GGML.format(model="other.nemo", audio="clip.wav")
          + " --weight-type q8_0 --weights-file q8_0.gguf",),
         weights_of_tiny("q8_0", other_model="other.nemo")),
    Case("hf_missing_tensor", "model", "Hugging Face Parakeet directory missing a tensor",
         parakeet("hf", ggml_only=True), lambda cwd, fx: hf_directory_missing_a_tensor(cwd / "hf")),
    # audio (both sides read it with audioparity.dumping.audio.load_audio before anything else)
    Case("audio_missing", "audio", "audio path that does not exist", parakeet(audio="none.wav")),
    Case("audio_empty", "audio", "audio file of 0 bytes", parakeet(audio="bad"), file_bytes(b"")),
    Case("audio_no_frames", "audio", "WAV with a header and no samples",
         parakeet(audio="zero.wav"),
         lambda cwd, fx: write_wav(cwd / "zero.wav", np.zeros(0))),
    Case("audio_truncated_header", "audio", "WAV truncated inside its header (20 bytes)",
         parakeet(audio="bad"), lambda cwd, fx: (cwd / "bad").write_bytes(
             fx.clip.read_bytes()[:20])),
    Case("audio_not_audio", "audio", "text file named .wav", parakeet(audio="text.wav"),
         lambda cwd, fx: (cwd / "text.wav").write_text("not audio\n" * 50)),
    Case("audio_shorter_than_a_frame", "audio", "audio shorter than one encoder frame (159 "
         "samples)", parakeet(audio="short.wav"),
         lambda cwd, fx: write_wav(cwd / "short.wav", clip_samples(fx)[:159])),
    Case("audio_too_long_for_memory", "audio", "audio too long for the memory the dump may use "
         "(60 s through the tiny model, whose attention then needs more than 8 MB)",
         ("AUDIOPARITY_MEMORY_MB=8 " + GGML.format(model="tiny.nemo", audio="long.wav"),),
         long_clip(60.0)),
    Case("audio_too_long_for_reference_memory", "audio", "audio too long for the memory the "
         "NeMo reference may use (the same 60 s; refused before NeMo is imported)",
         ("AUDIOPARITY_MEMORY_MB=8 " + REFERENCE.format(model="tiny.nemo", audio="long.wav"),),
         long_clip(60.0)),
    Case("audio_nan", "audio", "float WAV holding NaN samples", parakeet(audio="nan.wav"),
         lambda cwd, fx: write_wav(cwd / "nan.wav", np.where(
             np.arange(4000) % 1000 == 7, np.nan, 0.1), subtype="FLOAT")),
    # MOSS prompt and checkpoint (both sides check them with the same code before torch)
    Case("moss_model_missing", "moss", "MOSS checkpoint directory that does not exist",
         moss(model="none")),
    Case("prompt_missing", "moss", "prompt file that does not exist", moss("none.json")),
    Case("prompt_not_json", "moss", "prompt that is not JSON", moss("bad.json"),
         prompt_file("text: hello")),
    Case("prompt_not_object", "moss", "prompt that is a JSON list", moss("bad.json"),
         prompt_file('["hello"]')),
    Case("prompt_missing_text", "moss", "prompt without `text`", moss("bad.json"),
         prompt_file('{"instruction": "calm"}')),
    Case("moss_reference_over_memory", "moss", "a model and prompt needing more memory than the "
         "MOSS reference may use (its float32 weights, the Python stack and the activations; "
         "refused before torch is imported)",
         ("AUDIOPARITY_MEMORY_MB=8 audioparity reference moss-voicegen --model moss --prompt "
          "prompt.json --output-dir out",)),
    Case("prompt_text_mistyped", "moss", "prompt whose `text` is a number", moss("bad.json"),
         prompt_file('{"text": 42}')),
    Case("prompt_empty_text", "moss", "prompt with empty `text`", moss("bad.json"),
         prompt_file('{"text": "  "}')),
    Case("prompt_language_mistyped", "moss", "prompt whose `language` is a list",
         moss("bad.json"), prompt_file('{"text": "Hello.", "language": ["en"]}')),
    Case("prompt_unknown_key", "moss", "prompt with an unknown key", moss("bad.json"),
         prompt_file('{"text": "Hello.", "voice": "calm"}')),
    Case("moss_config_mistyped", "moss", "MOSS config.json with a mistyped field "
         "(`hidden_size: \"64\"`)", moss(model="m"),
         lambda cwd, fx: moss_copy(fx, cwd / "m",
                                   config=lambda c: c["language_config"].update(hidden_size="64"))),
    Case("moss_missing_weight", "moss", "MOSS checkpoint missing a tensor", moss(model="m"),
         lambda cwd, fx: moss_copy(fx, cwd / "m", tensors=lambda s: s.pop(
             "language_model.layers.1.mlp.down_proj.weight"))),
    Case("moss_shapes_disagree", "moss", "MOSS weights whose shapes disagree with the config "
         "(`intermediate_size` 160 -> 128)", moss(model="m"),
         lambda cwd, fx: moss_copy(fx, cwd / "m", config=lambda c: c["language_config"].update(
             intermediate_size=128))),
    Case("moss_nan_weight", "moss", "MOSS weights holding a NaN", moss(model="m"),
         lambda cwd, fx: moss_copy(fx, cwd / "m", tensors=moss_nan)),
    # usage: argparse lists the valid values (exit 2, after the usage lines)
    Case("unknown_weight_type", "usage", "unknown weight type",
         (GGML.format(model="tiny.nemo", audio="clip.wav") + " --weight-type q4_k",),
         exit_code=2),
    Case("unknown_backend", "usage", "unknown backend",
         (GGML.format(model="tiny.nemo", audio="clip.wav") + " --backend metal",), exit_code=2),
    Case("unknown_moss_weight_type", "usage", "unknown MOSS weight type",
         ("audioparity ggml moss-voicegen --model moss --prompt prompt.json --output-dir out "
          "--weight-type int4",), exit_code=2),
    Case("reference_outputs_unpaired", "usage", "reference given two audio files but one "
         "output directory", ("audioparity reference parakeet-tdt --model tiny.nemo --audio "
                              "clip.wav --audio clip.wav --output-dir out",)),
    Case("reference_option_of_another_implementation", "usage",
         "the transformers reference's option given to NeMo's",
         (REFERENCE.format(model="tiny.nemo", audio="clip.wav") + " --attention-mask 0",)),
    Case("reference_transformers_cannot_express", "usage",
         "transformers' Parakeet given a model it cannot express (the tiny fixture's joint is "
         "wider than its prediction network)",
         (REFERENCE.format(model="tiny.nemo", audio="clip.wav") + " --implementation "
          "transformers",)),
    # dumps read by the ggml dump (teacher forcing) and by compare
    Case("reference_dir_missing", "dumps", "reference dump directory that does not exist",
         ("audioparity ggml parakeet-tdt --model tiny.nemo --audio clip.wav --reference-dir none "
          "--output-dir out",)),
    Case("npy_truncated", "dumps", "candidate `.npy` cut short", (COMPARE,), truncated_npy),
    Case("manifest_not_json", "dumps", "candidate manifest.json that is not JSON", (COMPARE,),
         manifest_not_json),
    Case("repro_without_graph", "dumps", "`audioparity repro` of a folder holding no saved graph",
         ("audioparity repro ref --backend vulkan",)),
    # a summary the workflow's last run does not vouch for: exit 2, never read as a result
    Case("summary_run_state_unreadable", "dumps",
         "summary whose run state (`results/report/run.json`) is cut short", (CHECK,),
         lambda cwd, fx: finished_run(cwd, '{"state": "fin'), exit_code=2),
    Case("summary_older_than_a_cell", "dumps", "summary older than one of its cells (a run "
         "that rewrote a cell and stopped before the summary)", (CHECK,),
         lambda cwd, fx: finished_run(cwd, '{"state": "finished"}', newer_cell=True),
         exit_code=2),
    # a bundle's results brought back (docs/bundles.md): merged only while current
    Case("bundle_returned_not_a_bundle", "dumps", "`bundle merge` of a folder that is no "
         "bundle's returned folder", ("audioparity bundle merge returned",),
         lambda cwd, fx: ((cwd / "returned").mkdir(), (cwd / "returned" / "bundle.json")
                          .write_text("{}"))),
    Case("bundle_returned_stale", "dumps", "`bundle merge` of results computed from a file "
         "that has changed since the bundle was packed", ("audioparity bundle merge returned",),
         returned_from_an_older_sweep),
)

ACCEPTED = (
    Accepted("stereo", "stereo WAV (downmixed)", parakeet(audio="stereo.wav"),
             lambda cwd, fx: write_wav(cwd / "stereo.wav",
                                       np.stack([clip_samples(fx)] * 2, axis=1) * [1.0, 0.5]),
             "downmixed", slow=True, check=lambda manifest: manifest["audio"]["channels"] == 2),
    Accepted("resampled", "44.1 kHz WAV (resampled)", parakeet(audio="44k.wav"),
             lambda cwd, fx: write_wav(cwd / "44k.wav", at_44k(clip_samples(fx)), rate=44100),
             "resampled", slow=True),
    *(Accepted(f"pcm_{subtype.lower()}", f"{label} WAV", parakeet(audio=f"{subtype}.wav",
                                                                   ggml_only=True),
               lambda cwd, fx, subtype=subtype: write_wav(cwd / f"{subtype}.wav",
                                                          clip_samples(fx), subtype=subtype),
               f"read WAV {subtype}",
               check=lambda manifest, subtype=subtype: manifest["audio"]["subtype"] == subtype)
      for subtype, label in (("PCM_U8", "8-bit unsigned"), ("PCM_24", "24-bit"),
                             ("FLOAT", "32-bit float"), ("DOUBLE", "64-bit float"))),
    Accepted("data_cut_short", "WAV whose data is cut short (header intact): libsndfile reads "
             "the frames that are there, both sides alike", parakeet(audio="cut.wav",
                                                                     ggml_only=True),
             lambda cwd, fx: (cwd / "cut.wav").write_bytes(
                 fx.clip.read_bytes()[:CLIP_HEADER_BYTES + 2 * CUT_FRAMES]),
             "read WAV PCM_16", check=lambda manifest: manifest["audio"]["frames"] == CUT_FRAMES),
    Accepted("position_table", "audio longer than the position table (`pos_emb_max_len` 4, "
             "39 encoder frames): no hard limit", parakeet(model="short_table.nemo"),
             lambda cwd, fx: nemo_with_config(
                 fx, cwd / "short_table.nemo",
                 lambda c: c["encoder"].update(pos_emb_max_len=4)), "T'=", slow=True),
)


@dataclass(frozen=True)
class SchemaCase:
    """A config that breaks config/schema.yaml: Snakemake's dry run names the key."""

    id: str
    config: str
    key: str


#: A Parakeet sweep whose files the configuration cases' folder has: the tiny fixture (built
#: by the workflow) on /dev/null.
TINY_SWEEP = ("families: [parakeet_tdt], parakeet_tdt: {models: [{name: tiny, path: "
              "results/fixtures/parakeet_tdt/tiny/model.nemo}], cases: [{name: c, path: "
              "/dev/null}]")

SCHEMA_CASES = (
    SchemaCase("schema_enum", "parakeet_tdt: {backends: [cpu, metal]}", "['backends'][1]"),
    SchemaCase("schema_type", "parakeet_tdt: {weight_types: f32}", "['weight_types']"),
    SchemaCase("schema_unknown_key", "parakeet_tdt: {bakends: [cpu]}", "'bakends'"),
    SchemaCase("schema_backend_env", "parakeet_tdt: {backends: [cpu, {name: vk, backend: "
               "vulkan, env: {lower: '1'}}]}", "['env']"),
    SchemaCase("schema_unmeasured_gates", "parakeet_tdt: {unmeasured_gates: {cuda: copied}}",
               "['unmeasured_gates']"),
    SchemaCase("config_unmeasured_gates",
               "parakeet_tdt: {unmeasured_gates: {'q4_0@cuda': copied}}", "'q4_0@cuda'"),
    SchemaCase("config_backend_setting_named_as_another",
               "parakeet_tdt: {backends: [cpu, {name: vulkan, backend: cuda}]}",
               "the vulkan backend"),
    SchemaCase("config_option", "parakeet_tdt: {options: {flash_attention: 2}}",
               "['flash_attention']"),
    SchemaCase("config_option_of_another_family", "parakeet_tdt: {options: {generate_rows: 4}}",
               "'generate_rows'"),
    SchemaCase("config_unknown_family", "families: [parakeet_tdt, wav2vec]", "'wav2vec'"),
    SchemaCase("config_reference_implementation", f"{{{TINY_SWEEP}, references: [{{name: "
               "nemo, implementation: nemo}, {name: hf, implementation: whisper}]}}",
               "implementation 'whisper'"),
    SchemaCase("config_reference_environment", f"{{{TINY_SWEEP}, references: [{{name: nemo, "
               "implementation: nemo}, {name: old, implementation: nemo, environment: "
               "nemo-9}]}}", "'nemo-9'"),
    SchemaCase("config_fixture_option", "fixtures: {moss_voicegen: {tiny: {massive: true}}}",
               "'massive'"),
)


@dataclass(frozen=True)
class CompareCase:
    """Dumps whose tensor disagrees in frame count, shape or layout: compare runs, the stage
    fails."""

    id: str
    input: str
    shape: tuple[int, int]
    layout: str


COMPARE_CASES = (
    CompareCase("compare_frames", "candidate tensor of another frame count (first axis)", (5, 3),
                "[T, D]"),
    CompareCase("compare_shapes", "candidate tensor of another width (not only its frames)",
                (4, 5), "[T, D]"),
    CompareCase("compare_layouts", "candidate tensor of another layout", (4, 3), "[D, T]"),
)


def at_44k(samples: np.ndarray) -> np.ndarray:
    """16 kHz samples linearly interpolated to 44.1 kHz (the same length in seconds, so the
    clip's reference dump still fits the ggml dump's teacher-forced stages)."""
    times = np.arange(len(samples) * 44100 // 16000) / 44100
    return np.interp(times, np.arange(len(samples)) / 16000, samples)


def sine(rate: int, seconds: float = 2.0, hz: float = 440.0) -> np.ndarray:
    return 0.5 * np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate)


# --- running -----------------------------------------------------------------------------------


def run(cwd: Path, command: str) -> subprocess.CompletedProcess:
    """``command`` (starting ``audioparity`` or ``snakemake``) in ``cwd``, as a subprocess."""
    argv = shlex.split(command)
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
    while "=" in argv[0]:  # NAME=value before the command: its environment
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    if argv[0] == "audioparity":
        argv = [sys.executable, "-m", "audioparity.cli", *argv[1:]]
    else:
        argv = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
                "--directory", str(cwd), *argv[1:]]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def the_error_line(result: subprocess.CompletedProcess) -> str:
    """The one error line of a refused command: the last line of stderr, no traceback, no
    other line mentioning an error."""
    lines = result.stderr.splitlines()
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in lines if ": error:" in line]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr[-3000:]
    return errors[0]


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def row(input_: str, commands: tuple[str, ...], exit_code: int, message: str, left: str) -> str:
    """One docs/errors.md table row."""
    shown = "<br>".join(f"`{cell(c)}`" for c in commands)
    return f"| {cell(input_)} | {shown} | {exit_code} | `{cell(message)}` | {left} |"


def run_case(case: Case, folder: Path, fx: Fixtures) -> str:
    """Run a refused case; its table row."""
    fx.link_into(folder)
    case.make(folder, fx)
    before = listing(folder)
    messages, leaves = set(), set()
    for command in case.commands:
        result = run(folder, command)
        assert result.returncode == case.exit_code, (command, result.stderr[-3000:])
        line = the_error_line(result)
        if case.exit_code == 1:
            assert line.startswith("audioparity: error: "), line
        messages.add(line)
        leaves.add(left_behind(folder, before, line, command))
    assert len(messages) == 1, f"the commands disagree: {messages}"
    assert len(leaves) == 1, f"the commands leave different things: {leaves}"
    return row(case.input, case.commands, case.exit_code, messages.pop(), leaves.pop())


def left_behind(folder: Path, before: list[str], line: str, command: str) -> str:
    """What a refused command left: nothing, or, for a refusal once stages were written, only
    `out.partial/` with them, its manifest holding the refusal's line (what the guard reads:
    never an `out/` that looks complete); removed for the next command."""
    from audioparity.dumping.artifacts import MANIFEST, REFUSED

    left = set(listing(folder)) - set(before)
    if not left:
        return NOTHING
    partial = folder / f"{OUT}.partial"
    assert all(path.split("/")[0] == partial.name for path in left), f"{command} left {left}"
    manifest = json.loads((partial / MANIFEST).read_text())
    assert line.endswith(manifest[REFUSED]), (line, manifest[REFUSED])
    stages = ", ".join(f"`{name}`" for name in [*manifest["tensors"], *manifest["documents"]])
    shutil.rmtree(partial)
    return (f"no `out/`; `out.partial/` with the stages written before the refusal ({stages}), "
            "its manifest's `refused` the line")


def run_accepted(case: Accepted, folder: Path, fx: Fixtures) -> str:
    """Run an accepted case: each command succeeds and logs and records the same note."""
    from audioparity.dumping.artifacts import Dump

    fx.link_into(folder)
    case.make(folder, fx)
    notes = set()
    for command in case.commands:
        result = run(folder, command)
        assert result.returncode == 0, (command, result.stderr[-3000:])
        manifest = Dump(folder / OUT).manifest
        found = [n for n in manifest["notes"] if n.startswith(case.note_start)]
        assert len(found) == 1, (command, manifest["notes"])
        assert found[0] in result.stderr, f"{command}: {found[0]!r} not in the log"
        assert case.check(manifest), manifest["audio"]
        notes.add(found[0])
        shutil.rmtree(folder / OUT)
    assert len(notes) == 1, f"the commands disagree: {notes}"
    return row(case.input, case.commands, 0, notes.pop(),
               "a complete `out/`; the note is in its manifest and in the log")


def run_schema(case: SchemaCase, folder: Path) -> str:
    (folder / "bad.yaml").write_text(case.config + "\n")
    command = "snakemake -n --configfile bad.yaml"
    result = run(folder, command)
    assert result.returncode == 1, result.stderr[-3000:]
    lines = (result.stdout + result.stderr).splitlines()
    if any(line.startswith("ValidationError: ") for line in lines):
        error = next(line for line in lines if line.startswith("ValidationError: "))
        where = next(line for line in lines if line.startswith("On instance["))
        message = f"{error} {where.rstrip(':')}"
    else:
        header = next(i for i, line in enumerate(lines) if line.startswith("WorkflowError"))
        message = lines[header + 1]
    assert case.key in message, (case.key, message)
    assert listing(folder) == ["bad.yaml"]
    return row(f"config `{case.config}`", (command,), 1, message, "nothing (no `.snakemake/`)")


def run_compare(case: CompareCase, folder: Path) -> str:
    small_dump(folder / "ref_small", (4, 3), "[T, D]")
    small_dump(folder / "cand", case.shape, case.layout)
    result = run(folder, COMPARE)
    assert result.returncode == 0, result.stderr[-3000:]
    (entry,) = json.loads((folder / OUT).read_text())
    assert entry["status"] == "fail" and "(candidate)" in entry["reason"] and \
        "(reference)" in entry["reason"], entry
    return row(case.input, (COMPARE,), 0, entry["reason"],
               "`out` (the cell): stage `enc_out` with status `fail` and this reason")


# --- pytest ------------------------------------------------------------------------------------


#: The valid MOSS prompt, ``prompt.json``.
MOSS_PROMPT = REPO / "resources" / "moss" / "en_instruction.json"


def moss_reference(model: Path, output: Path) -> Path:
    """The torch reference dump of :data:`MOSS_PROMPT` through ``model`` at ``output``, which a
    MOSS ggml dump reads (``--reference-dir``)."""
    from audioparity.dumping.driver import dump_reference
    from audioparity.models.registry import family

    dump_reference(family("moss_voicegen"), model, [(MOSS_PROMPT, output)], options={})
    return output


@pytest.fixture(scope="module")
def fixtures(parakeet_model: Path, parakeet_reference: Path, clip_wav: Path,
             moss_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Fixtures:
    return Fixtures(parakeet_model, parakeet_reference, clip_wav, moss_model, MOSS_PROMPT,
                    moss_reference(moss_model, tmp_path_factory.mktemp("errors") / "moss-ref"))


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def params(cases: tuple) -> list:
    return [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if getattr(c, "slow", False)
                         else []) for c in cases]


@pytest.mark.parametrize("case", params(CASES))
def test_refused_input_gives_one_line_and_leaves_nothing(case, fixtures, doc, tmp_path):
    assert run_case(case, tmp_path, fixtures) in doc


@pytest.mark.parametrize("case", params(ACCEPTED))
def test_accepted_input_is_logged_and_recorded(case, fixtures, doc, tmp_path):
    assert run_accepted(case, tmp_path, fixtures) in doc


@pytest.mark.parametrize("case", params(SCHEMA_CASES))
def test_config_breaking_the_schema_names_the_key(case, doc, tmp_path):
    assert run_schema(case, tmp_path) in doc


@pytest.mark.parametrize("case", params(COMPARE_CASES))
def test_dumps_of_other_shape_or_layout_fail_the_stage_naming_both(case, doc, tmp_path):
    assert run_compare(case, tmp_path) in doc


def test_a_refused_dump_removes_the_folders_it_made(tmp_path):
    """An input refused inside the first stage, before it wrote anything, leaves nothing, not
    even the folders made for the dump; one refused once a stage was written keeps the partial
    dump for the guard (tests/test_artifacts.py)."""
    from audioparity.contract.errors import AudioparityError
    from audioparity.dumping.artifacts import DumpWriter

    (tmp_path / "results").mkdir()
    with pytest.raises(AudioparityError, match="stage refused"):
        with DumpWriter(tmp_path / "results" / "ggml" / "cpu" / "out", producer="test") as writer:
            with writer.timed("mel_features"):
                raise AudioparityError("stage refused")
    assert listing(tmp_path) == ["results"]


# --- the samples of accepted formats, against numpy float64 ------------------------------------


def decode_wav(path: Path) -> np.ndarray:
    """Mono float64 samples of a PCM/float WAV, decoded from its bytes with numpy alone:
    unsigned 8-bit ``(x-128)/128``, signed ``x / 2**(bits-1)``, float as stored; the channel
    mean."""
    data = path.read_bytes()
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    chunks, offset = {}, 12
    while offset + 8 <= len(data):
        size = int.from_bytes(data[offset + 4:offset + 8], "little")
        chunks[data[offset:offset + 4]] = data[offset + 8:offset + 8 + size]
        offset += 8 + size + (size & 1)
    fmt = chunks[b"fmt "]
    tag, channels = int.from_bytes(fmt[0:2], "little"), int.from_bytes(fmt[2:4], "little")
    bits = int.from_bytes(fmt[14:16], "little")
    if tag == 0xFFFE:  # WAVE_FORMAT_EXTENSIBLE: the sub-format GUID starts with the tag
        tag = int.from_bytes(fmt[24:26], "little")
    raw = chunks[b"data"]
    if tag == 3:
        values = np.frombuffer(raw, dtype="<f4" if bits == 32 else "<f8").astype(np.float64)
    elif bits == 8:
        values = (np.frombuffer(raw, dtype=np.uint8).astype(np.float64) - 128) / 128
    else:
        width = bits // 8
        octets = np.frombuffer(raw, dtype=np.uint8).reshape(-1, width).astype(np.int64)
        unsigned = sum(octets[:, i] << (8 * i) for i in range(width))
        signed = np.where(unsigned >= 1 << (bits - 1), unsigned - (1 << bits), unsigned)
        values = signed / float(1 << (bits - 1))
    return values.reshape(-1, channels).mean(axis=1)


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE"])
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_samples_equal_numpy_float64_decoding(subtype, channels, tmp_path):
    from audioparity.dumping.audio import load_audio

    path = tmp_path / "x.wav"
    rng = np.random.default_rng(channels)
    write_wav(path, rng.uniform(-0.99, 0.99, size=(3000, channels)), subtype=subtype)
    audio = load_audio(path)
    expected = decode_wav(path).astype(np.float32)
    assert audio.samples.dtype == np.float32
    np.testing.assert_array_equal(audio.samples, expected)
    assert audio.source["subtype"] == subtype and audio.source["channels"] == channels
    assert audio.notes[0].startswith(f"read WAV {subtype}")
    assert any(n.startswith("downmixed") for n in audio.notes) == (channels > 1)


def test_resampling_keeps_a_sine_and_is_noted(tmp_path):
    from audioparity.dumping.audio import load_audio

    path = tmp_path / "44k.wav"
    write_wav(path, sine(44100), rate=44100, subtype="FLOAT")
    audio = load_audio(path, sample_rate=16000)
    assert len(audio.samples) == 32000
    middle = slice(400, -400)  # away from the filter's edges
    np.testing.assert_allclose(audio.samples[middle], sine(16000)[middle], atol=2e-4)
    assert audio.notes[-1] == "resampled 44100 Hz to 16000 Hz with soxr (HQ)"


# --- the document ------------------------------------------------------------------------------

HEADER = """# Errors: what each bad input gives

Generated by `python -m tests.test_errors` from real runs of the command line; the tests in
`tests/test_errors.py` run every row again and fail if its line here differs. Commands run in a
folder holding `tiny.nemo` (the seeded fixture), `ref` (its NeMo reference dump of `clip.wav`),
`clip.wav` (`resources/speech/clip.wav`), `moss` (the tiny MOSS checkpoint), `prompt.json`
(`resources/moss/en_instruction.json`) and `moss-ref` (its torch reference dump of
`prompt.json`); other names are the bad inputs.

Exit codes: 0 done, 1 refused (the message is the last and only error line on stderr, no
traceback), 2 usage (argparse prints the usage lines, then the error line). Where a row lists a
`reference` command too, the NeMo/torch reference refuses the input with the same line: both
sides check the config, the audio (or prompt) and the checkpoint's tensors with the same code,
in that order, before NeMo or torch is imported. A refused dump leaves nothing: the writer works
in `out.partial/` and removes it (and any parent folder it made) on failure. Files that
cannot be opened for lack of permission have no row: CI runs as root, which may open anything.
"""

SECTIONS = {
    "model": "## Model files",
    "audio": "## Audio",
    "moss": "## MOSS prompt and checkpoint",
    "usage": "## Usage",
    "dumps": "## Dumps read by a later stage",
}

ACCEPTED_HEADER = """## Inputs that work, and what is recorded

Every audio subtype libsndfile decodes works; the samples equal a numpy float64 decoding of the
file rounded once to float32 (`test_samples_equal_numpy_float64_decoding`). The note is logged
(`audioparity INFO audio <file>: <note>`) and kept in the manifest's `notes`; the manifest's
`audio` field records format, subtype, channels, rate and frames of the file as read.

Audio longer than the position table: NeMo's `RelPositionalEncoding` holds `pos_emb_max_len`
(5000 for v3) positions, but `ConformerEncoder.forward` extends it for a longer input
(`update_max_seq_length`) and the ggml port computes the table for the frames it is given: there
is no hard limit, only attention's memory, which grows as T'^2. Both dumps note it.
"""

SCHEMA_HEADER = """## Workflow configuration

`snakemake` validates the config against `config/schema.yaml` before it plans a job; the message
column holds Snakemake's `ValidationError` line and the `On instance[...]` line naming the key.
The family names, and each family's own `options` and fixture entries, are then checked against
the families' specs (`src/audioparity/workflow/plan.py`): the message is the line under
Snakemake's `WorkflowError` header.
"""

COMPARE_HEADER = """## Reference and candidate that disagree in shape or layout

`compare` does not stop the sweep for these: the stage fails, and its reason names both. A
tensor whose frame count alone differs (its first axis; the others agree) is still measured,
over the frames both hold; any other difference of shape leaves it unmeasured.
"""

CHECK_DUMP_HEADER = """## check-dump: a candidate's dump against the contract

`audioparity check-dump DIR --family F [--adapter A]` only reads. Each problem is one line on
stdout (the message column), then stderr ends with `audioparity: error: DIR: N problem(s) against
the dump contract of F, listed on stdout`, exit 1; a conforming dump prints one line
`ok: DIR: ...`, exit 0. Each row plants one problem in an otherwise valid Parakeet-TDT dump
(`dump`, written by `DumpWriter`) or transcribe.cpp folder (`raw`, `.f32` + `.json` pairs named
as its adapter maps them, with the taps it declares unmapped). A stage the manifest's
`not_exposed` names is not required (a port that prints only its decode); files an adapter
declares `unmapped` are allowed, not compared, but must be readable. The rows are the cases of
`tests/candidates/test_check_dump.py` (`DOC_CASES`), which runs each again. What is required,
allowed and finite: docs/design.md, "Checking a dump".
"""

TABLE = ("| input | command | exit | message | left on disk |\n"
         "|---|---|---|---|---|")


def write_doc(rows: dict[str, list[str]]) -> str:
    parts = [HEADER]
    for section, title in SECTIONS.items():
        parts.append(f"{title}\n\n{TABLE}\n" + "\n".join(rows[section]) + "\n")
    for header, key in ((ACCEPTED_HEADER, "accepted"), (SCHEMA_HEADER, "schema"),
                        (COMPARE_HEADER, "compare"), (CHECK_DUMP_HEADER, "check_dump")):
        parts.append(f"{header}\n{TABLE}\n" + "\n".join(rows[key]) + "\n")
    return "\n".join(parts)


def main() -> None:
    """Build the fixtures, run every case (the check-dump cases last, in this process), and
    rewrite docs/errors.md."""
    from audioparity.dumping.driver import dump_reference
    from audioparity.models.registry import family
    from tests.candidates.test_check_dump import DOC_CASES, check_row

    with tempfile.TemporaryDirectory(prefix="audioparity_errors_") as scratch:
        base = Path(scratch)
        clip = REPO / "resources" / "speech" / "clip.wav"
        parakeet = family("parakeet_tdt")
        parakeet.fixture(base / "tiny", seed=0)
        dump_reference(parakeet, base / "tiny" / "model.nemo", [(clip, base / "ref")],
                       options={})
        family("moss_voicegen").fixture(base / "moss", seed=0)
        fx = Fixtures(base / "tiny" / "model.nemo", base / "ref", clip, base / "moss",
                      MOSS_PROMPT, moss_reference(base / "moss", base / "moss-ref"))
        rows: dict[str, list[str]] = {key: [] for key in (*SECTIONS, "accepted", "schema",
                                                          "compare", "check_dump")}
        for kind, cases, runner in (
            ("case", CASES, lambda c, f: run_case(c, f, fx)),
            ("accepted", ACCEPTED, lambda c, f: run_accepted(c, f, fx)),
            ("schema", SCHEMA_CASES, run_schema),
            ("compare", COMPARE_CASES, run_compare),
            ("check_dump", DOC_CASES, check_row),
        ):
            for case in cases:
                folder = base / "cases" / kind / case.id  # the ids are unique per kind
                folder.mkdir(parents=True)
                rows[case.section if kind == "case" else kind].append(runner(case, folder))
                print(f"{case.id}: ok", file=sys.stderr)
    DOC.write_text(write_doc(rows), encoding="utf-8")
    print(f"wrote {DOC}", file=sys.stderr)


if __name__ == "__main__":
    main()
