#!/usr/bin/env python3
"""A stand-in for the seed ``dump_cpp_reference`` (audio.cpp's Parakeet-TDT parity dumper,
``../shared/seeds/parakeet_dump_cpp_reference.cpp.txt``): its command line, files, messages
and exit codes, computed with this project's ggml port, so the ``parakeet_dump_cpp`` adapter is
tested without the C++ tool. Run it with the project's Python::

    python tests/standins/parakeet_dump_cpp.py --model M --audio A --nemo-dir N --output-dir O
        [--matmul-weight-type native|f32|f16|bf16|q8_0] [--backend cpu|cuda|vulkan]
        [--device N] [--flash-attention 0|1] [--encoder-only 1] [--decoder-input ENC_OUT.npy]

Files in ``--output-dir``: ``mel_features.npy`` ``[T, n_mels]`` (our frontend, NeMo's valid
frames), ``enc_out.npy`` ``[T', D]`` (our encoder), ``layer_0.npy`` ``[T', D]`` (our layer 0
alone on ``--nemo-dir``'s ``pre_encode.npy`` ``[1, T', D]`` and ``pos_emb.npy``
``[1, 2T'-1, D]``, both rank 3 or refused); with ``--decoder-input`` only
``decoder_tokens.json`` ``{ids, frames, durations}`` (our greedy decoder on that ``[T', D]``).
One thread; convolution kernels in f32 (the seed keeps the checkpoint's, f32 for a ``.nemo``).
Exit 0 done, 1 failed (``dump_cpp_reference failed: ...``), 2 usage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

USAGE = ("usage: {prog} --model --audio --nemo-dir --output-dir [--matmul-weight-type "
         "native|f16|bf16|q8_0] [--flash-attention 1] [--backend cpu|cuda|vulkan] [--device "
         "index] [--encoder-only 1 (no --nemo-dir required)] [--decoder-input (no --nemo-dir "
         "required)]")


def arg_value(argv: list[str], name: str, fallback: str) -> str:
    """The word after the first ``name`` in ``argv`` (past the program), else ``fallback``, as
    the seed reads its flags (unknown ones are ignored)."""
    for i in range(1, len(argv) - 1):
        if argv[i] == name:
            return argv[i + 1]
    return fallback


def _runtime_parts(model: Path, weight_type: str, backend: str, device: int):
    """The family, the model's config and the runtime its weights go on (the seed's asset
    loading); the weights are uploaded by :func:`_upload` inside the runtime."""
    from audioparity.contract.errors import AudioparityError
    from audioparity.ggml import Runtime
    from audioparity.models.registry import family

    if backend not in ("cpu", "cuda", "vulkan"):
        raise AudioparityError(f"unsupported --backend: {backend}")
    parakeet = family("parakeet_tdt")
    config = parakeet.config(model)
    return parakeet, config, Runtime(backend, device=device, threads=1)


def _upload(parakeet, runtime, model: Path, config, weight_type: str):
    """The weights at ``weight_type``, the convolution kernels f32 (the seed's weight loading,
    through the project's one storage policy)."""
    from audioparity.dumping.driver import RunSettings, upload_weights

    weights, _ = upload_weights(parakeet, runtime, model, config,
                                RunSettings(weight_type, runtime.backend_name,
                                            {"conv_weight_type": "f32"}))
    return weights


def decoder_replay(model: Path, enc_path: Path, output_dir: Path, weight_type: str,
                   backend: str, device: int) -> None:
    """``--decoder-input``: our greedy TDT decoder on a saved ``[T', D]`` encoder output."""
    from audioparity.contract.errors import AudioparityError
    from audioparity.models.parakeet_tdt.decoder import TdtDecoder

    parakeet, config, runtime = _runtime_parts(model, weight_type, backend, device)
    with runtime:
        weights = _upload(parakeet, runtime, model, config, weight_type)
        enc_out = np.load(enc_path, allow_pickle=False)
        if enc_out.ndim != 2 or enc_out.shape[0] <= 0 or enc_out.shape[1] != \
                config.encoder.d_model:
            raise AudioparityError("decoder input must be [frames, encoder_hidden_size]")
        with TdtDecoder(runtime, weights, config) as decoder:
            path = decoder.greedy(np.ascontiguousarray(enc_out, dtype=np.float32))
    document = {"ids": path.ids, "frames": path.frames, "durations": path.durations}
    (output_dir / "decoder_tokens.json").write_text(json.dumps(document, separators=(",", ":"))
                                                    + "\n")


def dump(model: Path, audio: Path, nemo_dir: Path, output_dir: Path, weight_type: str,
         backend: str, device: int, flash_attention: bool, encoder_only: bool) -> None:
    """Mel and encoder output end to end, then layer 0 alone on ``--nemo-dir``'s tensors."""
    from audioparity.contract.errors import AudioparityError
    from audioparity.dumping.audio import load_audio
    from audioparity.models.parakeet_tdt.encoder import Encoder
    from audioparity.models.parakeet_tdt.frontend import mel_features
    from audioparity.models.parakeet_tdt.layout import FB, WINDOW

    parakeet, config, runtime = _runtime_parts(model, weight_type, backend, device)
    with runtime:
        weights = _upload(parakeet, runtime, model, config, weight_type)
        sound = load_audio(audio, sample_rate=config.preprocessor.sample_rate,
                           min_samples=config.min_samples, purpose="one encoder frame")
        if sound.source.get("channels") != 1:
            raise AudioparityError("dump_cpp_reference requires mono audio")
        mel = mel_features(sound.samples, config.preprocessor,
                           filterbank=weights.buffers.get(FB),
                           window=weights.buffers.get(WINDOW))
        np.save(output_dir / "mel_features.npy", mel)
        print(f"mel_features: frames={mel.shape[0]} feature_dim={mel.shape[1]}")
        encoder = Encoder(weights, config, runtime, flash_attention=flash_attention)
        enc_out = encoder.forward(mel)["enc_out"]
        np.save(output_dir / "enc_out.npy", enc_out)
        print(f"enc_out: frames={enc_out.shape[0]} valid_frames={enc_out.shape[0]} "
              f"hidden={enc_out.shape[1]}")
        if encoder_only:
            print(f"Wrote mel_features.npy and enc_out.npy to {output_dir}")
            return
        pre_encode = np.load(nemo_dir / "pre_encode.npy", allow_pickle=False)
        pos_emb = np.load(nemo_dir / "pos_emb.npy", allow_pickle=False)
        if pre_encode.ndim != 3 or pos_emb.ndim != 3:
            raise AudioparityError("expected NeMo pre_encode/pos_emb dumps to be rank-3 "
                                   "[1, T, D]")
        if pre_encode.shape[2] != config.encoder.d_model:
            raise AudioparityError("NeMo pre_encode hidden_size does not match this model's "
                                   "config")
        first = pre_encode[0].astype(np.float32)
        if config.encoder.xscale is not None:  # as our port's isolated layers: NeMo's pos_enc
            first = first * np.float32(config.encoder.xscale)
        layer_0 = encoder.layer(0, first, pos_emb[0].astype(np.float32))
    np.save(output_dir / "layer_0.npy", layer_0)
    print(f"layer_0: frames={layer_0.shape[0]} hidden={layer_0.shape[1]}")
    print(f"\nWrote mel_features.npy, enc_out.npy, layer_0.npy to {output_dir}")


def main(argv: list[str]) -> int:
    """The seed's ``main``: usage check (exit 2), then one of the two modes (exit 0, or 1 with
    one ``dump_cpp_reference failed:`` line)."""
    audio = arg_value(argv, "--audio", "")
    nemo_dir = arg_value(argv, "--nemo-dir", "")
    output_dir = arg_value(argv, "--output-dir", "")
    encoder_only = arg_value(argv, "--encoder-only", "0") == "1"
    decoder_input = arg_value(argv, "--decoder-input", "")
    if not audio or (not encoder_only and not decoder_input and not nemo_dir) or not output_dir:
        print(USAGE.format(prog=argv[0]), file=sys.stderr)
        return 2
    model = Path(arg_value(argv, "--model", "models/parakeet-tdt-0.6b-v3"))
    weight_type = arg_value(argv, "--matmul-weight-type", "native")
    backend = arg_value(argv, "--backend", "cpu")
    try:
        if weight_type not in ("native", "f32", "f16", "bf16", "q8_0"):
            raise ValueError(f"unsupported tensor storage type: {weight_type}")
        device = int(arg_value(argv, "--device", "0"))
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        if decoder_input:
            decoder_replay(model, Path(decoder_input), Path(output_dir), weight_type, backend,
                           device)
        else:
            dump(model, Path(audio), Path(nemo_dir), Path(output_dir), weight_type, backend,
                 device, arg_value(argv, "--flash-attention", "0") == "1", encoder_only)
    except Exception as err:  # the seed's catch of std::exception
        print(f"dump_cpp_reference failed: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
