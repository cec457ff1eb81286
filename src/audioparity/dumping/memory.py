"""The host memory a process may use (what the machine has free, at most what the user or the
job's scheduler granted), what a reference process needs for its model, and the one-line
refusal of a job that would not fit. Read by both sides' checks and by the workflow's ``mem_mb``
(:func:`job_memory_mb`)."""

from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path

from audioparity.contract.errors import AudioparityError

#: Environment variable: the host memory (MB) a process may use for its activations, when less
#: than the machine has free (a job granted less by its scheduler).
MEMORY_LIMIT = "AUDIOPARITY_MEMORY_MB"
#: Resident memory of a reference process before its model: Python, torch, NeMo or transformers.
REFERENCE_STACK_BYTES = 1500 * 2**20
#: Bytes per value assumed for a checkpoint whose headers cannot be read: the smallest storage
#: type of a float checkpoint (bf16, f16), so that its value count is never underestimated.
SMALLEST_VALUE_BYTES = 2
#: Resident memory (MiB) of a ggml-side job's process before the model: the Python stack; a
#: converter's (``convert``: a third-party port's conversion, run by ``audioparity``).
BASE_MEMORY_MB = {"ggml": 600, "convert": 1000}
#: Bytes per weight of each storage type (q8_0: 34 per block of 32; ``native``, not listed,
#: counts as float32, the worst case of a checkpoint's own types).
STORAGE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32}
#: The bytes one chunk of attention's query rows may hold: both sides compute full-context
#: attention in chunks of query rows (NeMo's ``RelPositionMultiHeadAttention`` in the
#: reference, ``rel_pos_attention`` in the ggml port), so that its score matrices grow as T',
#: not T'^2; a clip short enough for this budget is one chunk.
ATTENTION_CHUNK_BYTES = 256 * 2**20
#: The bytes one chunk of the ggml port's subsampling may hold
#: (:func:`audioparity.models.parakeet_tdt.subsampling.pre_encode_chunks`): its feature maps
#: grow with the clip (a 30-minute clip's first convolution alone is 5.5 GiB at 256 channels);
#: a clip short enough for this budget is one chunk.
SUBSAMPLING_CHUNK_BYTES = 256 * 2**20
#: How many ``[H, r, T']`` float32 tensors one chunk of NeMo's attention holds at once in the
#: reference (:class:`audioparity.models.parakeet_tdt.chunked_attention.ChunkedRelPosAttention`):
#: ``rel_shift``'s padded copy of ``matrix_bd``, ``matrix_ac``, the scores, the masked scores,
#: the softmax and the masked weights.
REFERENCE_SCORE_COPIES = 6


def host_free_bytes() -> int | None:
    """The host's ``MemAvailable`` (``/proc/meminfo``), at most :data:`MEMORY_LIMIT` MB; None
    when neither is known."""
    limits = []
    if os.environ.get(MEMORY_LIMIT):
        limits.append(int(os.environ[MEMORY_LIMIT]) * 2**20)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    return min(limits, default=None)


def float_values(model: Path) -> int:
    """How many float values (weights) a checkpoint holds, from its headers alone: the F32,
    F16 and BF16 tensors of a Hugging Face directory's safetensors, the float tensors of an
    uncompressed ``.nemo``'s ``model_weights.ckpt`` (its ``data.pkl``; no weight is read).
    Anything else (a compressed ``.nemo``, an unreadable file, which the job itself reports)
    counts its bytes on disk at :data:`SMALLEST_VALUE_BYTES` each: never fewer values than it
    holds."""
    model = Path(model)
    stat = model.stat()
    return _float_values(model, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=64)
def _float_values(model: Path, mtime_ns: int, size: int) -> int:
    from audioparity.checkpoints import float_entries

    try:
        entries = float_entries(model)
    except (AudioparityError, OSError):
        entries = None
    if entries is None:
        files = model.rglob("*") if model.is_dir() else [model]
        return sum(f.stat().st_size for f in files if f.is_file()) // SMALLEST_VALUE_BYTES
    return sum(math.prod(entry.shape) for entry in entries.values())


def reference_bytes(model: Path, emulates: bool) -> int:
    """What a reference process holds for ``model`` besides its activations: the stack
    (:data:`REFERENCE_STACK_BYTES`), the model in float32 (:func:`float_values`), when it
    emulates a weight type (:func:`audioparity.dumping.emulation.emulations`) the float32 originals
    it saves, a second copy, and for a ``.nemo`` a third: NeMo's ``restore_from`` loads the
    checkpoint's tensors beside the model's, and the allocator keeps most of them (the v3
    shape: 1.9 GB of its 2.4 GB, measured before the encoder runs)."""
    copies = 1 + emulates + (Path(model).suffix == ".nemo")
    return REFERENCE_STACK_BYTES + float_values(model) * 4 * copies


def attention_chunk_rows(n_rows: int, row_bytes: int, max_chunks: int | None = None) -> int:
    """How many query rows one chunk of attention computes: as many as fit
    :data:`ATTENTION_CHUNK_BYTES` at ``row_bytes`` per row (the score tensors of one query row,
    every head), at least one, at least ``ceil(n_rows / max_chunks)`` when the chunks are
    counted (a ggml graph holds a bounded number of nodes), at most ``n_rows`` (one chunk)."""
    rows = max(1, ATTENTION_CHUNK_BYTES // max(1, row_bytes))
    if max_chunks:
        rows = max(rows, -(-n_rows // max_chunks))
    return min(rows, max(1, n_rows))


def refuse_if_over(need: int, subject: str, remedy: str, detail: str = "") -> None:
    """Refuse, in one line and before any work, a process that would need ``need`` bytes of
    host memory when fewer are free (:func:`host_free_bytes`): ``<subject> needs about N MiB
    <detail>, more than the F MiB free (machine or AUDIOPARITY_MEMORY_MB): <remedy>``. A process
    killed for memory says nothing, and can take its parent with it.

    Raises:
        AudioparityError: ``need`` exceeds the memory free.
    """
    free = host_free_bytes()
    if free is not None and need > free:
        raise AudioparityError(
            f"{subject} needs about {need / 2**20:.0f} MiB{detail}, more than the "
            f"{free / 2**20:.0f} MiB free (machine or {MEMORY_LIMIT}): {remedy}")


def job_memory_mb(side: str, model: Path, weight_type: str | None, emulates: bool,
                  copies: int = 1) -> int:
    """The memory (MiB) a workflow job of ``side`` needs for ``model``, counted from its
    weights (:func:`float_values`, the checkpoint's headers): on the ``reference`` side
    :func:`reference_bytes` (``emulates``: it emulates a weight type); on the ``ggml`` side
    and for a converter (``convert``) :data:`BASE_MEMORY_MB` plus the weights in the storage
    type of ``weight_type`` (:data:`STORAGE_BYTES`); ``copies`` dumps in one job (a drill-down
    runs two)."""
    if side == "reference":
        need = reference_bytes(model, emulates) / 2**20
    else:
        need = (BASE_MEMORY_MB[side] + float_values(model) / 2**20
                * STORAGE_BYTES.get(weight_type or "f32", STORAGE_BYTES["f32"]))
    return int(copies * need) + 1


def refuse_over_limit(need: int, limit: float | None, subject: str) -> None:
    """Refuse a job whose estimate ``need`` (MiB) exceeds the memory given to the workflow
    (``--resources mem_mb``; None: not given), in one line naming ``subject`` (``ggml job of
    parakeet_tdt/tiny/f32``): Snakemake would otherwise shrink its request silently.

    Raises:
        AudioparityError: ``need`` exceeds ``limit``.
    """
    if isinstance(limit, int | float) and need > limit:
        raise AudioparityError(f"{subject} needs about {need} MB, more than "
                               f"--resources mem_mb={limit}: give it more memory")
