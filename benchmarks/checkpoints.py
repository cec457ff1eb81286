"""Random-weight checkpoints with the real architectures' shapes, for the benchmarks.

- Parakeet-TDT: a NeMo ``EncDecRNNTBPEModel`` ``.nemo`` shaped like parakeet-tdt-0.6b-v3 (d_model
  1024, 24 layers, 8 heads, 128 mels, dw_striding x8 with 256 channels, LSTM 2x640, joint 640,
  8192 tokens + blank + 5 durations), built through NeMo by the family's own fixture builder
  (:meth:`ParakeetTdt.fixture`: same v3 config, seeded re-drawn weights) with only the sizes
  changed and a SentencePiece tokenizer of 8192 pieces trained offline on a synthetic corpus.
  No download.
- MOSS-VoiceGenerator: a checkpoint directory like the real one (``config.json``,
  ``model.safetensors`` in bfloat16, tokenizer) with a Qwen3 backbone of the 1.7B shape (hidden
  2048, 28 layers, 16 heads, 8 key/value heads, head_dim 128, SwiGLU 6144, 151936 text rows),
  ``n_vq`` 16 and 1024 audio codes; the tokenizer and special ids come from the family's
  fixture builder (:meth:`MossVoicegen.fixture`). The weights (2.1 B values) are drawn and
  written one tensor at a time, so building needs well under 1 GB.

Shapes: ``full`` (the ones above), ``small`` (MOSS with Qwen3-0.6B's backbone, for machines with
less memory; Parakeet stays v3, 2.4 GB at f32) and ``tiny`` (for checking the benchmark
scripts themselves: tests/test_benchmarks.py). Built checkpoints are cached under the cache
directory, named by shape and seed; a finished build is renamed into place, so a cached path is
always complete.

Command line (the benchmark runner calls it in a child process)::

    python benchmarks/checkpoints.py parakeet --shape v3 --output DIR/parakeet-v3-s0.nemo
    python benchmarks/checkpoints.py moss --shape 1.7b --output DIR/moss-1.7b-s0
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from unittest import mock

import numpy as np

log = logging.getLogger("audioparity.bench")


@dataclass(frozen=True)
class ParakeetShape:
    """Sizes of a Parakeet-TDT model (everything else is v3's, from the fixture config)."""

    d_model: int
    n_layers: int
    n_heads: int
    subsampling_conv_channels: int
    pred_hidden: int
    joint_hidden: int
    vocab_size: int


@dataclass(frozen=True)
class QwenShape:
    """Sizes of a MOSS backbone (Qwen3 ``language_config``) and its codebooks."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    n_vq: int
    audio_vocab_size: int


PARAKEET_SHAPES = {
    "v3": ParakeetShape(1024, 24, 8, 256, 640, 640, 8192),
    "tiny": ParakeetShape(64, 2, 4, 24, 48, 56, 96),
}
MOSS_SHAPES = {
    "1.7b": QwenShape(2048, 28, 16, 8, 128, 6144, 151936, 16, 1024),  # Qwen3-1.7B
    "0.6b": QwenShape(1024, 28, 16, 8, 128, 3072, 151936, 16, 1024),  # Qwen3-0.6B
    "tiny": QwenShape(128, 2, 4, 2, 32, 256, 512, 4, 96),
}
#: The weights file of a MOSS benchmark checkpoint (one file, bfloat16).
MOSS_WEIGHTS = "model.safetensors"
#: ``--size`` of the runner -> (Parakeet shape, MOSS shape).
SIZES = {"full": ("v3", "1.7b"), "small": ("v3", "0.6b"), "tiny": ("tiny", "tiny")}


def build_parakeet(output: Path, shape: ParakeetShape, seed: int = 0) -> None:
    """Write a Parakeet-TDT ``.nemo`` of ``shape`` at ``output`` through the family's fixture
    builder (:meth:`ParakeetTdt.fixture`): its v3 config with the sizes replaced, its seeded
    weight re-draw, its atomic save, and a tokenizer of ``shape.vocab_size`` pieces (its
    ``vocab_size`` option)."""
    from audioparity.models.parakeet_tdt import fixture
    from audioparity.models.registry import family

    parakeet = family("parakeet_tdt")
    base_config = fixture.fixture_config

    def fixture_config(tokenizer_dir: Path, *args) -> dict:
        cfg = base_config(tokenizer_dir, *args)
        cfg["model_defaults"].update(enc_hidden=shape.d_model, pred_hidden=shape.pred_hidden,
                                     joint_hidden=shape.joint_hidden)
        cfg["encoder"].update(d_model=shape.d_model, n_layers=shape.n_layers,
                              n_heads=shape.n_heads,
                              subsampling_conv_channels=shape.subsampling_conv_channels)
        cfg["decoder"]["prednet"]["pred_hidden"] = shape.pred_hidden
        cfg["joint"]["jointnet"]["joint_hidden"] = shape.joint_hidden
        return cfg

    folder = output.with_name(f".{output.name}.{os.getpid()}.fixture")
    with mock.patch.object(fixture, "fixture_config", fixture_config):
        parakeet.fixture(folder, seed=seed, vocab_size=shape.vocab_size)
    os.replace(folder / parakeet.spec.fixture_model, output)
    shutil.rmtree(folder)


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (as torch's ``.to(torch.bfloat16)``)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _draw(name: str, shape: tuple[int, ...], rng: np.random.Generator, rows: slice,
          pad_code: int) -> np.ndarray:
    """Rows ``rows`` of weight ``name``: 1-D norm weights ``1 + 0.1 N``; embeddings ``N(0, 1)``
    (codebook pad rows zero, as upstream ships them); matrices ``N(0, 1) / sqrt(fan_in)``."""
    if len(shape) == 1:
        return 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
    n = rows.stop - rows.start
    values = rng.standard_normal((n, shape[1]), dtype=np.float32)
    if name.startswith("emb_ext."):
        if rows.start <= pad_code < rows.stop:
            values[pad_code - rows.start] = 0.0
    elif "embed_tokens" not in name:
        values *= np.float32(1.0 / np.sqrt(shape[1]))
    return values


def write_bf16_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], seed: int,
                           pad_code: int, chunk_values: int = 1 << 24) -> None:
    """Write seeded random weights of ``shapes`` as one bfloat16 safetensors file, drawing and
    writing at most ``chunk_values`` values at a time (format: 8-byte little-endian header size,
    JSON header padded to 8 bytes, then the data in header order)."""
    names = sorted(shapes)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in names:
        size = 2 * int(np.prod(shapes[name]))
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]),
                        "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(blob)))
        out.write(blob)
        for index, name in enumerate(names):
            shape = shapes[name]
            rng = np.random.default_rng([seed, index])
            if len(shape) == 1:
                out.write(_bf16_bits(_draw(name, shape, rng, slice(0, 1), pad_code)).tobytes())
                continue
            step = max(1, chunk_values // shape[1])
            for start in range(0, shape[0], step):
                rows = slice(start, min(start + step, shape[0]))
                out.write(_bf16_bits(_draw(name, shape, rng, rows, pad_code)).tobytes())


def build_moss(output: Path, shape: QwenShape, seed: int = 0) -> None:
    """Write a MOSS checkpoint directory of ``shape`` at ``output``: the project's fixture (its
    tokenizer, chat template and special ids) with ``config.json`` resized and
    ``model.safetensors`` replaced by :func:`write_bf16_safetensors` weights."""
    from audioparity.models.moss_voicegen.checkpoint import expected_shapes
    from audioparity.models.registry import family

    moss = family("moss_voicegen")
    partial = output.with_name(f".{output.name}.{os.getpid()}.partial")
    moss.fixture(partial, seed=seed)
    try:
        raw = json.loads((partial / "config.json").read_text())
        raw.update(n_vq=shape.n_vq, audio_vocab_size=shape.audio_vocab_size,
                   audio_pad_code=shape.audio_vocab_size)
        lang = {key: value for key, value in asdict(shape).items()
                if key not in ("n_vq", "audio_vocab_size")}
        raw["language_config"].update(lang, max_window_layers=shape.num_hidden_layers)
        (partial / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
        config = moss.config(partial)
        write_bf16_safetensors(partial / MOSS_WEIGHTS, expected_shapes(config), seed,
                               config.audio_pad_code)
        if output.exists():
            shutil.rmtree(output)
        os.replace(partial, output)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=("parakeet", "moss"))
    parser.add_argument("--shape", required=True)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.family == "parakeet":
        build_parakeet(args.output, PARAKEET_SHAPES[args.shape], args.seed)
    else:
        build_moss(args.output, MOSS_SHAPES[args.shape], args.seed)


if __name__ == "__main__":
    main()
