"""One benchmark measurement in this process; the runner (:mod:`run`) starts one process per
measurement, so that each peak RSS belongs to one implementation, weight type and thread count.

Usage: ``python benchmarks/measure.py '<json spec>'``; the result is printed as one line
``BENCH-RESULT {json}`` on stdout. Spec keys: ``kind`` (``parakeet_torch``, ``parakeet_ggml``,
``moss_torch``, ``moss_ggml``), ``model`` (checkpoint path), ``work`` (directory of the shared
inputs and of the reference outputs the ggml side is compared with), ``threads``, ``reps``;
ggml only: ``weight_type`` and ``accel`` (``""`` or ``"blas"``); MOSS only: ``steps``.

What is timed (milliseconds per call, ``time.perf_counter``, after ``warmup`` untimed calls;
imports and weight loading are timed separately and never mixed in):

- ``parakeet_torch``: the model loaded as the reference dump loads it
  (:meth:`Family.load_reference`); ``encoder`` = NeMo ``model.encoder(audio_signal, length)`` on
  the shared mel; ``decoder`` = NeMo's greedy TDT decoding (``model.decoding``, label
  looping, batch 1, the reference's strategy) of the resulting ``enc_out``. Writes ``enc_out``
  and the decoded ids.
- ``parakeet_ggml``: ``encoder`` = :meth:`Encoder.forward` (graph build, allocation, compute,
  read-back of every tap, as a dump runs it); ``decoder`` = :meth:`TdtDecoder.greedy` on NeMo's
  ``enc_out`` (same input as NeMo's decoder). Weights are loaded as a dump loads them
  (:func:`audioparity.dumping.driver.upload_weights` with the ggml side's default options, streamed
  from the ``.nemo``).
- ``moss_torch``: the model loaded as the reference dump loads it; ``prefill`` = the
  reference's modules on ``S`` rows with the heads at the last
  row only (the same work as the ggml prefill); ``prefill_upstream`` =
  :func:`reference.forward` as the reference dump runs it (upstream applies the heads to every
  row); ``step`` = one cached row (:func:`reference.forward` with the KV cache) after the
  prefill, heads included.
- ``moss_ggml``: ``prefill`` = :meth:`Backbone.prefill` of the ``S`` rows; ``step`` =
  :meth:`Backbone.step`. Weights are loaded as a dump loads them
  (:func:`audioparity.dumping.driver.upload_weights`: streamed from the safetensors file a block of
  rows at a time, so that a 1.7B model fits in memory at f32).

The ggml side reports parity with the reference run at the same thread count: ``enc_out``
cosine and ``max_rel`` (max_abs / max|ref|), whether the greedy ids equal NeMo's, MOSS last
hidden state after the prefill and after the first step. It also reports the bytes of its
weights buffer, of the scheduler's compute buffer (activations) and of the KV cache, and the
process RSS after each stage (``/proc/self/status``: VmRSS, VmHWM).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("GGML_NO_BACKTRACE", "1")

RESULT_MARK = "BENCH-RESULT "
WARMUP = 1
#: The registered families the kinds measure (:func:`audioparity.models.registry.family`).
PARAKEET, MOSS = "parakeet_tdt", "moss_voicegen"


class Stages:
    """Process memory after named stages, from ``/proc/self/status`` (MiB)."""

    def __init__(self) -> None:
        self.rss: dict[str, dict[str, float]] = {}

    def __call__(self, stage: str) -> None:
        status = Path("/proc/self/status").read_text().splitlines()
        values = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in status
                  if line.startswith(("VmRSS", "VmHWM", "RssAnon", "RssFile"))}
        self.rss[stage] = {key: round(value, 1) for key, value in values.items()}


def repeat(call: Callable[[], Any], reps: int, warmup: int = WARMUP) -> tuple[list[float], Any]:
    """Milliseconds of ``reps`` calls after ``warmup`` untimed ones, and the last result."""
    result = None
    for _ in range(warmup):
        result = call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - start) * 1e3)
    return times, result


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays, flattened, in float64."""
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def max_rel(candidate: np.ndarray, reference: np.ndarray) -> float:
    """max_abs / max|ref| (the max_rel of audioparity.compare.metrics), in float64."""
    diff = np.abs(candidate.astype(np.float64) - reference.astype(np.float64))
    return float(diff.max() / np.abs(reference.astype(np.float64)).max())


def _reference_file(work: Path, stem: str, threads: int, suffix: str = ".npy") -> Path | None:
    """The reference output ``stem`` of the same thread count, else of any thread count."""
    same = work / f"{stem}_t{threads}{suffix}"
    if same.exists():
        return same
    return next(iter(sorted(work.glob(f"{stem}_t*{suffix}"))), None)


def _save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.npy")
    np.save(tmp, array)
    os.replace(tmp, path)


def _set_torch_threads(threads: int):
    import torch

    torch.set_num_threads(threads)
    return torch


def _runtime(threads: int, accel: str, threadpool: bool = False):
    """A CPU :class:`Runtime`; with ``accel="blas"`` its scheduler also holds ggml's BLAS
    backend (first, as llama.cpp adds ACCEL devices), so large f32-activation matmuls go to
    BLAS; with ``threadpool`` the CPU backend computes every graph on one persistent
    ``ggml_threadpool`` (as llama.cpp does) instead of starting threads per graph. The
    project's Runtime does neither (see BENCHMARKS.md)."""
    import ggml

    from audioparity.ggml import Runtime

    if accel in ("cuda", "vulkan"):  # the accelerator, the CPU beside it for what it lacks
        return Runtime(accel, threads=threads)
    runtime = Runtime("cpu", threads=threads)
    if threadpool:
        params = ggml.ggml_threadpool_params_default(threads)
        pool = ggml.ggml_threadpool_new(ctypes.byref(params))
        ggml.ggml_backend_cpu_set_threadpool(runtime._cpu, pool)
        runtime.threadpool = pool  # kept alive with the runtime
    if accel == "blas":
        if not getattr(ggml, "GGML_USE_BLAS", False):
            raise SystemExit("accel=blas: this ggml-python has no BLAS backend")
        ggml.ggml_backend_blas_init.restype = ctypes.c_void_p
        blas = ggml.ggml_backend_blas_init()
        ggml.ggml_backend_blas_set_n_threads(blas, threads)
        handles = (ctypes.c_void_p * 2)(blas, runtime._cpu)
        runtime._sched = ggml.ggml_backend_sched_new(handles, None, 2, runtime.graph_size,
                                                     False, False)
    elif accel:
        raise SystemExit(f"unknown accel {accel!r}")
    return runtime


def upload_family_weights(name: str, runtime, model: Path, weight_type: str) -> tuple[Any, Any]:
    """Family ``name``'s weights of ``model`` in ``runtime`` at ``weight_type``, as its ggml
    dump uploads them (:func:`audioparity.dumping.driver.upload_weights` with the ggml side's
    default options), and the model's config."""
    from audioparity.dumping.driver import RunSettings, side_options, upload_weights
    from audioparity.models.registry import family

    chosen = family(name)
    config = chosen.config(model)
    weights, _ = upload_weights(chosen, runtime, model, config,
                                RunSettings(weight_type, runtime.backend_name,
                                            side_options(chosen, "ggml", {})))
    return weights, config


def _ggml_loaded(spec: dict, stages: Stages, family: str, seconds: dict) -> tuple[Any, Any, Any]:
    """``(runtime, weights, config)``: the ggml runtime ``spec`` asks for and ``family``'s weights
    of ``spec["model"]`` uploaded to it in ``spec["weight_type"]``, the host copies freed; the
    time into ``seconds["load"]``, the process's memory staged at each step."""
    start = time.perf_counter()
    runtime = _runtime(spec["threads"], spec.get("accel", ""), spec.get("threadpool", False))
    stages("host_weights")
    weights, config = upload_family_weights(family, runtime, Path(spec["model"]),
                                            spec["weight_type"])
    stages("uploaded")
    gc.collect()
    stages("host_freed")
    seconds["load"] = time.perf_counter() - start
    return runtime, weights, config


def _compute_buffer_bytes(runtime) -> int:
    """Bytes of the scheduler's compute buffers (the largest graph's activations so far)."""
    import ggml

    return sum(int(ggml.ggml_backend_sched_get_buffer_size(runtime._sched, backend))
               for backend in runtime._backends)


def _build_info() -> dict:
    """How this ggml-python was built (``doctor``: llamafile is a CPU feature, BLAS a backend
    registry), with BLAS the library ggml's BLAS device names (``MKL``, ``OpenBLAS``, ...), and
    with OpenBLAS the kernel set in use."""
    from audioparity.ggml import doctor

    info = doctor()
    build = {"ggml_python": info["ggml_python"], "registries": info["registries"],
             "llamafile": "llamafile" in info["cpu_features"],
             "cpu_features": info["cpu_features"],
             "blas": next((d["description"] for d in info["devices"]
                           if d["registry"] == "BLAS"), None)}
    if build["blas"] == "OpenBLAS":
        try:
            openblas = ctypes.CDLL("libopenblas.so.0")
            openblas.openblas_get_corename.restype = ctypes.c_char_p
            build["openblas_core"] = openblas.openblas_get_corename().decode()
        except (OSError, AttributeError):
            build["openblas_core"] = None
    return build


def parakeet_torch(spec: dict, stages: Stages) -> dict:
    """NeMo encoder and greedy TDT decoding (module docstring)."""
    threads, reps, work = spec["threads"], spec["reps"], Path(spec["work"])
    start = time.perf_counter()
    torch = _set_torch_threads(threads)
    import nemo.collections.asr  # noqa: F401

    from audioparity.models.parakeet_tdt.references import nemo as reference
    from audioparity.models.registry import family

    seconds = {"import": time.perf_counter() - start}
    parakeet, path = family(PARAKEET), Path(spec["model"])
    start = time.perf_counter()
    config = parakeet.config(path)
    model = parakeet.load_reference(path, config, {}).module
    seconds["load"] = time.perf_counter() - start
    stages("loaded")
    mel_path = work / "mel.npy"
    if not mel_path.exists():
        case = parakeet.open_case(path, config, work / "audio.wav", {})
        features, length = reference.preprocessor(model, case.data.samples)
        _save(mel_path, features[0, :, : int(length[0])].T.float().numpy())
    mel = np.load(mel_path)
    features = torch.from_numpy(np.ascontiguousarray(mel.T))[None]
    length = torch.tensor([mel.shape[0]], dtype=torch.int64)

    def encoder():
        with torch.inference_mode():
            return model.encoder(audio_signal=features, length=length)

    enc_ms, (encoded, encoded_length) = repeat(encoder, reps)
    stages("encoder")
    enc_out = encoded[0, :, : int(encoded_length[0])].T.contiguous().numpy()
    _save(work / f"enc_out_t{threads}.npy", enc_out)
    decode, joint_logits, *_ = reference.greedy_tdt_decoding(model, enc_out)  # sets strategy
    enc_t = torch.from_numpy(enc_out).T.contiguous()[None]
    enc_len = torch.tensor([enc_out.shape[0]], dtype=torch.int64)

    def decoder():
        with torch.inference_mode():
            return model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=enc_t, encoded_lengths=enc_len, return_hypotheses=True)

    dec_ms, _ = repeat(decoder, reps)
    stages("decoder")
    (work / f"decode_t{threads}.json").write_text(json.dumps(decode["ids"]))
    return {"parts": {"encoder": enc_ms, "decoder": dec_ms}, "seconds": seconds,
            "info": {"mel_frames": int(mel.shape[0]), "enc_frames": int(enc_out.shape[0]),
                     "joint_rows": int(len(joint_logits)), "tokens": len(decode["ids"]),
                     "torch": torch.__version__}}


def parakeet_ggml(spec: dict, stages: Stages) -> dict:
    """ggml encoder and greedy TDT decoder (module docstring)."""
    threads, reps, work = spec["threads"], spec["reps"], Path(spec["work"])
    start = time.perf_counter()
    from audioparity.models.parakeet_tdt.decoder import TdtDecoder
    from audioparity.models.parakeet_tdt.encoder import Encoder

    seconds = {"import": time.perf_counter() - start}
    stages("imported")
    runtime, weights, config = _ggml_loaded(spec, stages, PARAKEET, seconds)
    mel = np.load(work / "mel.npy")
    encoder = Encoder(weights, config, runtime)
    enc_ms, taps = repeat(lambda: encoder.forward(mel), reps)
    stages("encoder")
    compute_bytes = _compute_buffer_bytes(runtime)
    parity: dict[str, Any] = {}
    ref_path = _reference_file(work, "enc_out", threads)
    ref_enc_out = np.load(ref_path) if ref_path else taps["enc_out"]
    if ref_path:
        parity["enc_out_cosine"] = cosine(taps["enc_out"], ref_enc_out)
        parity["enc_out_max_rel"] = max_rel(taps["enc_out"], ref_enc_out)
    with TdtDecoder(runtime, weights, config) as decoder:
        dec_ms, path = repeat(lambda: decoder.greedy(ref_enc_out), reps)
    stages("decoder")
    ids_path = _reference_file(work, "decode", threads, ".json")
    if ids_path:
        parity["decode_equal"] = path.ids == json.loads(ids_path.read_text())
    return {"parts": {"encoder": enc_ms, "decoder": dec_ms}, "seconds": seconds,
            "parity": parity,
            "bytes": {"weights": int(weights.nbytes), "compute": compute_bytes},
            "info": {"joint_rows": len(path.row_frames), "tokens": len(path.ids),
                     **_build_info()}}


def _moss_inputs(work: Path) -> tuple[np.ndarray, np.ndarray]:
    return np.load(work / "rows.npy"), np.load(work / "step_rows.npy")


def moss_torch(spec: dict, stages: Stages) -> dict:
    """Reference prefill (same work as ggml, and as upstream) and cached steps."""
    threads, reps, work = spec["threads"], spec["reps"], Path(spec["work"])
    start = time.perf_counter()
    torch = _set_torch_threads(threads)
    import transformers

    from audioparity.models.moss_voicegen.references import remote_code as reference
    from audioparity.models.registry import family

    seconds = {"import": time.perf_counter() - start}
    moss, model = family(MOSS), Path(spec["model"])
    start = time.perf_counter()
    net = moss.load_reference(model, moss.config(model), {}).module
    seconds["load"] = time.perf_counter() - start
    stages("loaded")
    rows, step_rows = _moss_inputs(work)
    prompt = torch.from_numpy(rows)[None]

    def prefill():
        """``reference.forward`` without the per-layer hooks and with the heads applied to the
        last row only: what :meth:`Backbone.prefill` computes."""
        out = net.language_model(None, None, None, None,
                                 inputs_embeds=net._compute_input_embeddings(prompt),
                                 use_cache=True)
        last = out.last_hidden_state[0, -1:]
        return out.last_hidden_state[0], [head(last) for head in net.lm_heads]

    with torch.inference_mode():
        prefill_ms, (hidden, _) = repeat(prefill, reps)
        stages("prefill")
        upstream_ms, full = repeat(lambda: reference.forward(net, prompt), min(reps, 2),
                                   warmup=0)
        stages("prefill_upstream")
        _save(work / f"last_hidden_t{threads}.npy", np.asarray(hidden[-1]))
        (_, cache), step_ms, first = full, [], None
        for index, row in enumerate(step_rows):
            start = time.perf_counter()
            result, cache = reference.forward(net, torch.from_numpy(row)[None, None], cache)
            elapsed = (time.perf_counter() - start) * 1e3
            if index == 0:
                first = np.asarray(result.hidden[-1])
            if index >= WARMUP:
                step_ms.append(elapsed)
        stages("step")
    _save(work / f"step_hidden_t{threads}.npy", first)
    return {"parts": {"prefill": prefill_ms, "prefill_upstream": upstream_ms, "step": step_ms},
            "seconds": seconds,
            "info": {"rows": int(rows.shape[0]), "torch": torch.__version__,
                     "transformers": transformers.__version__}}


def moss_ggml(spec: dict, stages: Stages) -> dict:
    """ggml prefill and cached steps (module docstring)."""
    threads, reps, work = spec["threads"], spec["reps"], Path(spec["work"])
    start = time.perf_counter()
    from audioparity.models.moss_voicegen.backbone import Backbone

    seconds = {"import": time.perf_counter() - start}
    stages("imported")
    runtime, uploaded, config = _ggml_loaded(spec, stages, MOSS, seconds)
    rows, step_rows = _moss_inputs(work)
    net = Backbone(runtime, uploaded, config, kv_cache_type="f32",
                   max_context=len(rows) + len(step_rows))
    prefill_ms, full = repeat(lambda: net.prefill(rows), reps)
    stages("prefill")
    step_ms, first = [], None
    for index, row in enumerate(step_rows):
        start = time.perf_counter()
        result = net.step(row)
        elapsed = (time.perf_counter() - start) * 1e3
        if index == 0:
            first = result.hidden[-1]
        if index >= WARMUP:
            step_ms.append(elapsed)
    stages("step")
    parity = {}
    for name, value in (("last_hidden", full.hidden[-1]), ("step_hidden", first)):
        ref_path = _reference_file(work, name, threads)
        if ref_path:
            ref = np.load(ref_path)
            parity[f"{name}_cosine"] = cosine(value, ref)
            parity[f"{name}_max_rel"] = max_rel(value, ref)
    return {"parts": {"prefill": prefill_ms, "step": step_ms}, "seconds": seconds,
            "parity": parity,
            "bytes": {"weights": int(uploaded.nbytes), "compute": _compute_buffer_bytes(runtime),
                      "kv_cache": int(net.cache.tensors.nbytes)},
            "info": {"rows": int(rows.shape[0]), **_build_info()}}


KINDS = {"parakeet_torch": parakeet_torch, "parakeet_ggml": parakeet_ggml,
         "moss_torch": moss_torch, "moss_ggml": moss_ggml}


def main() -> None:
    spec = json.loads(sys.argv[1])
    stages = Stages()
    stages("start")
    result = KINDS[spec["kind"]](spec, stages)
    result["rss_stages_mib"] = stages.rss
    print(RESULT_MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
