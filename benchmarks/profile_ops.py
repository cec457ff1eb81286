"""Where the time goes: per-op profile of one benchmark part, ggml or torch.

ggml: the scheduler's eval callback (``ggml_backend_sched_set_eval_callback``) asks to observe
every node, so the scheduler computes the graph one node at a time; each node is timed from the
callback's "ask" to its "observe" (compute only, with the thread pool's per-node start-up
included: small nodes look slower than in a fused run). Nodes are grouped by op, by the type of
their first source (the weight's storage type for ``MUL_MAT``) and, for matmuls, by shape
``[rows x cols] . [cols x batch]``. torch: ``torch.profiler`` (CPU, self time by op).

Usage (after ``make bench`` built the checkpoints, or any checkpoint of these families)::

    python benchmarks/profile_ops.py parakeet ggml --model M.nemo --weight-type f32 --threads 2
    python benchmarks/profile_ops.py parakeet torch --model M.nemo --threads 2
    python benchmarks/profile_ops.py moss ggml --model DIR --weight-type q8_0 --part step
    python benchmarks/profile_ops.py moss torch --model DIR --part prefill

The input is the same as the benchmark's (``--seconds`` of the project's clip, ``--rows`` seeded
rows). Prints a table of the top ops and writes it as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("GGML_NO_BACKTRACE", "1")


class NodeTimer:
    """Per-node compute times of ggml graphs through the scheduler's eval callback."""

    def __init__(self, runtime) -> None:
        import ggml

        self.ggml = ggml
        self.totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        self._started = 0.0
        self._callback = ggml.ggml_backend_sched_eval_callback(self._observe)
        ggml.ggml_backend_sched_set_eval_callback(runtime._sched, self._callback, None)

    def _key(self, tensor) -> str:
        ggml = self.ggml
        t = tensor.contents
        op = ggml.ggml_op_desc(tensor).decode()
        src0 = t.src[0]
        if not src0:
            return op
        s = src0.contents
        kind = ggml.ggml_type_name(s.type).decode()
        if op in ("MUL_MAT", "MUL_MAT_ID"):
            src1 = t.src[1].contents
            return f"{op} {kind} [{s.ne[1]}x{s.ne[0]}].[{src1.ne[0]}x{src1.ne[1] * src1.ne[2]}]"
        return f"{op} {kind}"

    def _observe(self, tensor, ask, _user) -> bool:
        now = time.perf_counter()
        if ask:
            self._started = now
            return True
        entry = self.totals[self._key(tensor)]
        entry[0] += (now - self._started) * 1e3
        entry[1] += 1
        return True

    def table(self) -> list[dict]:
        total = sum(ms for ms, _ in self.totals.values())
        rows = [{"op": key, "ms": ms, "count": count, "share": ms / total}
                for key, (ms, count) in self.totals.items()]
        return sorted(rows, key=lambda r: -r["ms"])


class HostSplit:
    """Where one call's wall time goes on the host, for :class:`audioparity.ggml.Graph`: the
    ggml C calls a graph's compute makes, each timed by wrapping it on the ``ggml`` module
    (``alloc``: ``ggml_backend_sched_reset`` and ``ggml_backend_sched_alloc_graph``;
    ``upload``: ``ggml_backend_tensor_set`` of the inputs; ``compute``:
    ``ggml_backend_sched_graph_compute``; ``download``: ``ggml_backend_tensor_get`` into
    numpy), and the rest of the call, ``host``: the graph built op by op through ctypes (none
    for a graph kept from an earlier call), put back for the scheduler, and the Python around
    it. ``compute`` is the floor a graph reused as it is would keep."""

    CALLS = {"alloc": ("ggml_backend_sched_reset", "ggml_backend_sched_alloc_graph"),
             "upload": ("ggml_backend_tensor_set",),
             "compute": ("ggml_backend_sched_graph_compute",),
             "download": ("ggml_backend_tensor_get",)}

    def __init__(self) -> None:
        import ggml

        self.ggml = ggml
        self.ms = dict.fromkeys(self.CALLS, 0.0)
        self.graphs = 0
        self._original = {name: getattr(ggml, name) for names in self.CALLS.values()
                          for name in names}

    def _timed(self, part: str, function: Callable) -> Callable:
        def timed(*args):
            start = time.perf_counter()
            try:
                return function(*args)
            finally:
                self.ms[part] += (time.perf_counter() - start) * 1e3
                self.graphs += function.__name__ == "ggml_backend_sched_graph_compute"
        timed.__name__ = function.__name__
        return timed

    def measure(self, call: Callable[[], Any]) -> dict[str, float]:
        """``call()`` once with the calls wrapped: ms per part, ``host`` the rest of its wall
        time, ``total`` the wall time and ``graphs`` the graphs computed."""
        for part, names in self.CALLS.items():
            for name in names:
                setattr(self.ggml, name, self._timed(part, self._original[name]))
        try:
            start = time.perf_counter()
            call()
            total = (time.perf_counter() - start) * 1e3
        finally:
            for name, function in self._original.items():
                setattr(self.ggml, name, function)
        return {**self.ms, "host": total - sum(self.ms.values()), "total": total,
                "graphs": self.graphs}


def _inputs(args, tmp: Path) -> Path:
    from run import Plan, prepare_inputs

    plan = Plan(size="", threads=[args.threads], weight_types=[], models=[], reps={},
                steps=2, rows=args.rows, seconds=args.seconds)
    prepare_inputs(tmp, plan, args.model if args.family == "moss" else None)
    return tmp


def _ggml_call(args, work: Path, runtime) -> Callable[[], Any]:
    """The part to profile on ``runtime``: the Parakeet encoder on the mel of ``audio.wav``, or
    the MOSS prefill or one cached step; weights uploaded as the family's ggml dump uploads them
    (:func:`measure.upload_family_weights`). A repeated encoder or prefill computes the graphs
    the first call kept; each step is at the next cache position, so a new graph."""
    from measure import MOSS, PARAKEET, upload_family_weights

    if args.family == "parakeet":
        from audioparity.models.parakeet_tdt.encoder import Encoder
        from audioparity.models.parakeet_tdt.frontend import mel_features
        from audioparity.models.parakeet_tdt.layout import FB, WINDOW
        from audioparity.models.registry import family

        weights, config = upload_family_weights(PARAKEET, runtime, args.model,
                                                args.weight_type)
        case = family(PARAKEET).open_case(args.model, config, work / "audio.wav", {})
        mel = mel_features(case.data.samples, config.preprocessor,
                           filterbank=weights.buffers.get(FB), window=weights.buffers.get(WINDOW))
        encoder = Encoder(weights, config, runtime)
        return lambda: encoder.forward(mel)
    from audioparity.models.moss_voicegen.backbone import Backbone

    weights, config = upload_family_weights(MOSS, runtime, args.model, args.weight_type)
    net = Backbone(runtime, weights, config, max_context=args.rows + 8)  # 4 calls + a margin
    rows, step_rows = np.load(work / "rows.npy"), np.load(work / "step_rows.npy")

    def call():
        if args.part == "prefill":
            return net.prefill(rows)  # the same rows again: the graph the first call kept
        return net.step(step_rows[0])  # at the next position: a new graph, as a decode's step

    net.prefill(rows)
    return call


def profile_ggml(args, work: Path) -> tuple[list[dict], float, dict[str, float]]:
    from measure import _runtime

    runtime = _runtime(args.threads, args.accel)
    call = _ggml_call(args, work, runtime)
    call()
    start = time.perf_counter()
    call()
    plain_ms = (time.perf_counter() - start) * 1e3
    split = HostSplit().measure(call)
    timer = NodeTimer(runtime)
    call()
    return timer.table(), plain_ms, split


def profile_torch(args, work: Path) -> tuple[list[dict], float, None]:
    import torch

    torch.set_num_threads(args.threads)
    from measure import MOSS, PARAKEET

    from audioparity.models.registry import family

    if args.family == "parakeet":
        from audioparity.models.parakeet_tdt.references import nemo as reference

        parakeet = family(PARAKEET)
        config = parakeet.config(args.model)
        model = parakeet.load_reference(args.model, config, {}).module
        case = parakeet.open_case(args.model, config, work / "audio.wav", {})
        features, length = reference.preprocessor(model, case.data.samples)

        def call():
            return model.encoder(audio_signal=features, length=length)
    else:
        from audioparity.models.moss_voicegen.references import remote_code as reference

        moss = family(MOSS)
        net = moss.load_reference(args.model, moss.config(args.model), {}).module
        rows = torch.from_numpy(np.load(work / "rows.npy"))[None]
        step = torch.from_numpy(np.load(work / "step_rows.npy")[:1])[None]
        with torch.inference_mode():
            _, cache = reference.forward(net, rows)

        def call():
            if args.part == "prefill":
                return reference.forward(net, rows)
            extra = cache.get_seq_length() - args.rows
            if extra:  # back to the same cached position every time
                cache.crop(-extra)
            return reference.forward(net, step, cache)

    with torch.inference_mode():
        call()
        start = time.perf_counter()
        call()
        plain_ms = (time.perf_counter() - start) * 1e3
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            call()
    total = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e3
    rows = [{"op": e.key, "ms": e.self_cpu_time_total / 1e3, "count": e.count,
             "share": e.self_cpu_time_total / 1e3 / total} for e in prof.key_averages()]
    return sorted(rows, key=lambda r: -r["ms"]), plain_ms, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=("parakeet", "moss"))
    parser.add_argument("impl", choices=("ggml", "torch"))
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--weight-type", default="f32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--part", choices=("prefill", "step"), default="prefill",
                        help="MOSS part (Parakeet: the encoder)")
    parser.add_argument("--accel", default="", help="ggml: 'blas' adds the BLAS backend")
    parser.add_argument("--seconds", type=float, default=9.9)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = _inputs(args, Path(tmp))
        table, plain_ms, split = (profile_ggml if args.impl == "ggml" else profile_torch)(
            args, work)
    total = sum(r["ms"] for r in table)
    print(f"{args.family} {args.impl} {args.weight_type if args.impl == 'ggml' else 'f32'} "
          f"{args.part if args.family == 'moss' else 'encoder'}, {args.threads} threads: "
          f"{plain_ms:.1f} ms unprofiled, {total:.1f} ms in ops when profiled")
    if split is not None:
        print(f"host split of {split['total']:.1f} ms, {split['graphs']} graphs: " + ", ".join(
            f"{part} {split[part]:.1f} ms" for part in (*HostSplit.CALLS, "host")))
    for r in table[: args.top]:
        print(f"{r['ms']:9.1f} ms {100 * r['share']:5.1f}% {r['count']:5d}x  {r['op']}")
    if args.json:
        args.json.write_text(json.dumps({"plain_ms": plain_ms, "ops": table, "split": split},
                                        indent=1))


if __name__ == "__main__":
    main()
