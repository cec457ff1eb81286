"""The ggml port's subsampling alone on a long clip: wall time and peak RSS of ``pre_encode``
(:meth:`audioparity.models.parakeet_tdt.encoder.Encoder.pre_encode`), which runs in chunks over
time (:mod:`audioparity.models.parakeet_tdt.subsampling`).

Parakeet v3's subsampling shape (dw_striding x8, 256 channels, 128 mels, d_model 1024) with
NeMo's ``ConvSubsampling`` randomly initialised, on ``--minutes`` of random mel frames (100 a
second), in this process: the peak RSS is this process's (``ru_maxrss``), with its RSS before
the subsampling beside it. Run it on two checkouts for a before and after (``--src``), and
compare the outputs it saves (``--save``). ``--tiny``: 8 channels, 16 mels, d_model 32 (checks
the script: tests/test_benchmarks.py).

Usage::

    python benchmarks/pre_encode_memory.py --minutes 30 --threads 2 --save after.npy
    python benchmarks/pre_encode_memory.py --minutes 30 --src OTHER/src --save before.npy
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

#: (mels, channels, d_model) of the shapes.
SHAPES = {"v3": (128, 256, 1024), "tiny": (16, 8, 32)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--src", type=Path, help="the package's source folder to import")
    parser.add_argument("--save", type=Path, help="write pre_encode here (.npy)")
    args = parser.parse_args()
    if args.src:
        sys.path.insert(0, str(args.src.resolve()))
    import torch
    from nemo.collections.asr.parts.submodules.subsampling import ConvSubsampling

    from audioparity.ggml import Runtime
    from audioparity.models.parakeet_tdt.config import from_nemo_config
    from audioparity.models.parakeet_tdt.encoder import Encoder
    from audioparity.models.parakeet_tdt.layout import to_graph_layout

    mels, channels, d_model = SHAPES["tiny" if args.tiny else "v3"]
    config = from_nemo_config({
        "preprocessor": {},
        "encoder": {"feat_in": mels, "n_layers": 1, "d_model": d_model, "n_heads": 4,
                    "subsampling": "dw_striding", "subsampling_factor": 8,
                    "subsampling_conv_channels": channels},
        "decoder": {"vocab_size": 4, "prednet": {"pred_hidden": 8}},
        "joint": {"num_classes": 4, "jointnet": {"joint_hidden": 8, "encoder_hidden": d_model,
                                                 "pred_hidden": 8}}})
    torch.manual_seed(0)
    module = ConvSubsampling(subsampling="dw_striding", subsampling_factor=8, feat_in=mels,
                             feat_out=d_model, conv_channels=channels,
                             activation=torch.nn.ReLU())
    arrays = to_graph_layout({"encoder.pre_encode." + k: v.detach().float().numpy()
                              for k, v in module.state_dict().items()},
                             config.encoder.batch_norm_eps)
    frames = round(args.minutes * 60 * 100)
    mel = np.random.default_rng(0).standard_normal((frames, mels)).astype(np.float32)
    before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with Runtime("cpu", threads=args.threads) as rt:
        encoder = Encoder(rt.upload(arrays, dict.fromkeys(arrays, "f32")), config, rt)
        start = time.perf_counter()
        out = encoder.pre_encode(mel)
        seconds = time.perf_counter() - start
    if args.save:
        np.save(args.save, out)
    print(json.dumps({"minutes": args.minutes, "mel_frames": frames, "frames": len(out),
                      "seconds": round(seconds, 4),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                           / 1024),
                      "rss_before_mb": round(before_mb)}))


if __name__ == "__main__":
    main()
