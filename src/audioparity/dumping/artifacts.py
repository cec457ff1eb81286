"""Dump directories: one ``.npy`` per tensor, JSON documents, and ``manifest.json``.

Layout of a dump directory (docs/design.md, "Dump contract")::

    <dir>/manifest.json         producer, model + sha256, input + sha256, backend, weight type,
                                threads, library versions, seconds per stage, status, tensors
    <dir>/<name>.npy            one tensor, canonical layout (batch dropped, time-major [T, D])
    <dir>/<name>.json           documents such as decode.json

Writes are atomic: everything goes to ``<dir>.partial/`` first and is renamed to ``<dir>`` only
when the writer commits, so a job that dies leaves nothing that a later stage takes as complete.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
import tokenize
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import DUMP_STATUSES, VIEWS
from audioparity.dumping.provenance import library_versions, model_digest, sha256_of

MANIFEST = "manifest.json"
#: The key of a partial dump's manifest naming the stage being timed when it was last written.
RUNNING = "running"
#: The key of a crashed dump's manifest naming the stage it died in (its ``running``).
CRASHED_IN = "crashed_in"
#: The key of a partial dump's manifest holding the refusal (an :class:`AudioparityError`'s
#: line) that stopped it after some stages.
REFUSED = "refused"
#: The key of the manifest of a dump on a backend other than the CPU listing the ops of its
#: graphs the backend does not support, which ggml's scheduler ran on the CPU (ggml-cuda
#: refuses a FLASH_ATTN_EXT whose mask has several slices): ``[{"phase": the stage running,
#: "op": name, "count": nodes}]``, in the order first met
#: (:func:`audioparity.ggml.runtime.record_ops_on_cpu`).
OPS_ON_CPU = "ops_on_cpu"
#: The key of a ggml dump's manifest giving, per stage, the seconds its graphs spent in the
#: backend's compute (``ggml_backend_sched_graph_compute``, synchronised), out of the stage's
#: ``seconds``: the part no host code can save (:func:`audioparity.ggml.runtime.open_runtime`).
GRAPH_SECONDS = "graph_seconds"


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


class DumpWriter:
    """Writes one dump directory atomically.

    Use as a context manager; tensors and documents land in ``<output_dir>.partial/`` and the
    directory is renamed to ``output_dir`` on a clean exit (after the manifest is written). The
    partial directory's manifest is rewritten as each stage lands, with the stage being timed
    (``running``), so a process that dies leaves a record of what it finished
    (:func:`audioparity.dumping.guard.run_guarded` makes a ``crashed`` dump of it). On an
    :class:`AudioparityError` (a refused input) before any stage was written, the partial
    directory is removed, and so are the (empty) parent folders the writer created for it; on one
    raised once a stage was written, or on another exception (a fault), it is kept, its manifest
    saying what finished and what ran (and, for a refusal, its line under :data:`REFUSED`): the
    stages before the refusal are still compared. The exception propagates either way.

    Args:
        output_dir: final directory.
        producer: ``nemo``, ``torch``, ``ggml`` or ``external``.
        model: model path (file or directory); its sha256 goes into the manifest.
        inputs: input files (audio, prompt) by role; their sha256 go into the manifest.
            Both may be omitted for a dump that only records a status (``crashed``).
        fields: further manifest fields (backend, weight_type, threads, ...).
        versions: distributions whose versions to record besides python and numpy.
        weights: the converted weights file the dump maps (``weights_file`` in the manifest);
            the model's sha256 is the one it records
            (:func:`audioparity.dumping.provenance.model_digest`).
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        *,
        producer: str,
        model: str | os.PathLike | None = None,
        inputs: dict[str, str | os.PathLike] | None = None,
        fields: dict[str, Any] | None = None,
        versions: tuple[str, ...] = (),
        weights: str | os.PathLike | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.partial = self.output_dir.with_name(self.output_dir.name + ".partial")
        #: The stage :meth:`timed` is timing now, None outside one.
        self.running: str | None = None
        self.manifest: dict[str, Any] = {
            "producer": producer,
            "model": None if model is None else {"path": str(model),
                                                 "sha256": model_digest(model, weights)},
            **({} if weights is None else {"weights_file": str(weights)}),
            "inputs": {
                role: {"path": str(p), "sha256": sha256_of(p)} for role, p in (inputs or {}).items()
            },
            **(fields or {}),
            "versions": library_versions(*versions),
            "status": "ok",
            "seconds": {},
            "tensors": {},
            "documents": {},
            "notes": [],
        }

    def __enter__(self) -> DumpWriter:
        if self.partial.exists():
            shutil.rmtree(self.partial)
        parent = self.partial.parent.absolute()
        self._created = [p for p in (parent, *parent.parents) if not p.exists()]
        self.partial.mkdir(parents=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            _write_json(self.partial / MANIFEST, self.manifest)
            if self.output_dir.exists():
                shutil.rmtree(self.output_dir)
            os.replace(self.partial, self.output_dir)
            return
        wrote = self.manifest["tensors"] or self.manifest["documents"]
        if not issubclass(exc_type, AudioparityError) or wrote:
            if issubclass(exc_type, AudioparityError):
                self.manifest[REFUSED] = _one_line(exc)
            self._progress()  # what finished, and what ran, for the guard
            return
        shutil.rmtree(self.partial, ignore_errors=True)  # refused before anything ran
        for folder in self._created:  # innermost first: the folders this writer made
            try:
                folder.rmdir()
            except OSError:
                break

    def add_tensor(self, name: str, array: np.ndarray, layout: str) -> None:
        """Store ``array`` as ``<name>.npy`` (C-contiguous, dtype kept).

        ``layout`` names the axes in the reference's notation, e.g. ``"[T, D]"``.
        """
        array = np.ascontiguousarray(array)
        np.save(self.partial / f"{name}.npy", array, allow_pickle=False)
        self.manifest["tensors"][name] = {
            "file": f"{name}.npy",
            "shape": list(array.shape),
            "dtype": str(array.dtype),
            "layout": layout,
        }
        self._progress()

    def add_json(self, name: str, document: Any) -> None:
        """Store a JSON document as ``<name>.json`` (e.g. ``decode``)."""
        _write_json(self.partial / f"{name}.json", document)
        self.manifest["documents"][name] = f"{name}.json"
        self._progress()

    def add_storage(self, record: dict[str, Any], hashes: dict[str, np.ndarray]) -> None:
        """Record the weights a dump computed with: the manifest's ``storage`` field
        (``record``: types, bits per weight, fallbacks, one hash per weight) and each weight's
        block hashes in :data:`~audioparity.dumping.storage.BLOCK_HASHES`."""
        from audioparity.dumping.storage import BLOCK_HASHES

        self.manifest["storage"] = record
        with open(self.partial / BLOCK_HASHES, "wb") as file:
            np.savez(file, **hashes)

    def note(self, text: str) -> None:
        """Record a remark for the reader (a downmix, a resample, a check that was made)."""
        self.manifest["notes"].append(text)

    def set_status(self, status: str, message: str = "") -> None:
        """Mark the dump ``unavailable`` or ``crashed`` (with the reason) instead of ``ok``."""
        if status not in DUMP_STATUSES:
            raise ValueError(f"status {status!r}: expected one of {', '.join(DUMP_STATUSES)}")
        self.manifest["status"] = status
        self.manifest["message"] = message

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Record the wall-clock seconds of a stage under ``manifest["seconds"][stage]``; the
        stage is :attr:`running` meanwhile."""
        start = time.perf_counter()
        self.running = stage
        self._progress()
        yield
        self.running = None
        self.manifest["seconds"][stage] = round(time.perf_counter() - start, 4)

    def _progress(self) -> None:
        """The partial directory's manifest as things stand, with :attr:`running`."""
        _write_json(self.partial / MANIFEST, {**self.manifest, RUNNING: self.running})


def viewed_layout(view: Sequence[Sequence[Any]], layout: str) -> str:
    """The layout string of a tensor that holds a view of a stage of ``layout``:
    ``[["row", 0], ["log_softmax"]]``, ``[steps, C]`` -> ``view row(0) log_softmax() of
    [steps, C]`` (what :func:`base_layout` reads back)."""
    steps = " ".join(f"{step[0]}({', '.join(map(str, step[1:]))})" for step in view)
    return f"view {steps} of {layout}"


def base_layout(layout: str) -> str:
    """The stage's layout in a layout string: a view's prefix (:func:`viewed_layout`) dropped."""
    text = layout.strip()
    return text.partition(" of ")[2].strip() if text.startswith("view ") else text


def same_layout(a: str, b: str) -> bool:
    """Layout strings equal up to whitespace (``[T,D]`` is ``[T, D]``)."""
    return "".join(a.split()) == "".join(b.split())


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temp file in the same folder, then rename,
    so a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def built_directory(output: str | os.PathLike) -> Iterator[Path]:
    """Build a directory (a fixture, a checkpoint) atomically: yield an empty temporary folder
    beside ``output``; on a clean exit it replaces ``output`` (an existing one is removed), on
    an exception it is removed and the exception propagates. Parent folders are created.

    Raises:
        AudioparityError: the parent folder cannot be created or written.
    """
    output = Path(output)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    except OSError as err:
        raise AudioparityError(f"{output}: cannot create the directory ({err})") from err
    try:
        yield work
        work.chmod(0o755)
        if output.exists():
            shutil.rmtree(output)
        os.replace(work, output)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _plain_file(value: Any, suffix: str) -> bool:
    """Whether ``value`` names a file directly inside the dump directory, ending ``suffix``."""
    return (isinstance(value, str) and value.endswith(suffix) and value != MANIFEST
            and Path(value).name == value and "\\" not in value and value != suffix)


def _dtype_name(value: Any) -> bool:
    """Whether ``value`` is a numpy dtype's own name (``float32``, ``int64``), as ``.npy`` files
    and :meth:`DumpWriter.add_tensor` spell it."""
    try:
        return isinstance(value, str) and str(np.dtype(value)) == value
    except (TypeError, ValueError, SyntaxError):
        return False


def _one_line_text(value: Any) -> bool:
    """Whether ``value`` is a string without line breaks or other control characters (it is
    quoted in one-line messages)."""
    return isinstance(value, str) and value.isprintable()


def manifest_problems(manifest: Any, where: Path) -> tuple[list[str], dict, dict]:
    """Every structural problem of a manifest, one line each, with its well-formed tensor
    entries and documents: the keys a reader uses, as :class:`DumpWriter` writes them
    (``tensors`` entries with a ``.npy`` file, an integer shape, a dtype and a layout;
    ``documents`` naming ``.json`` files; a known ``status``; numeric ``seconds``; a
    candidate's ``conventions``, ``not_exposed`` and ``unreadable``). :class:`Dump` refuses
    the first; ``audioparity check-dump`` lists them all."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("tensors"), dict):
        return [f"{where}: expected an object with a 'tensors' object"], {}, {}
    problems, tensors, documents = [], {}, {}
    for name, entry in manifest["tensors"].items():
        if (isinstance(entry, dict) and _plain_file(entry.get("file"), ".npy")
                and isinstance(entry.get("shape"), list)
                and all(type(n) is int and n >= 0 for n in entry["shape"])
                and _dtype_name(entry.get("dtype")) and _one_line_text(entry.get("layout"))):
            tensors[name] = entry
        else:
            problems.append(f"{where}: tensors[{name!r}] is {json.dumps(entry)[:120]}; expected "
                            "{file: '<name>.npy', shape: [int, ...], dtype: a numpy dtype name, "
                            "layout: one line}")
    listed = manifest.get("documents", {})
    if not isinstance(listed, dict):
        problems.append(f"{where}: 'documents' is {json.dumps(listed)[:80]}; expected an object "
                        "mapping names to '<name>.json' files")
        listed = {}
    for name, file in listed.items():
        if _plain_file(file, ".json"):
            documents[name] = file
        else:
            problems.append(f"{where}: documents[{name!r}] is {json.dumps(file)[:80]}; expected "
                            "'<name>.json'")
    if manifest.get("status", "ok") not in DUMP_STATUSES:
        problems.append(f"{where}: status {manifest.get('status')!r}; expected one of "
                        f"{', '.join(DUMP_STATUSES)}")
    if not isinstance(manifest.get("message", ""), str):
        problems.append(f"{where}: 'message' must be a string")
    seconds = manifest.get("seconds", {})
    if not isinstance(seconds, dict) or not all(type(v) in (int, float)
                                                for v in seconds.values()):
        problems.append(f"{where}: 'seconds' must map stages to numbers")
    conventions = manifest.get("conventions", {})
    if not (isinstance(conventions, dict) and all(map(_convention_ok, conventions.values()))):
        problems.append(f"{where}: 'conventions' is {json.dumps(conventions)[:80]}; expected "
                        "{stage: {view: [[row, k] | [log_softmax], ...], omits: [field, ...], "
                        "why: one line}}")
    for key in ("not_exposed", "unreadable"):
        if not _not_exposed_ok(manifest.get(key, {})):
            problems.append(f"{where}: {key!r} is {json.dumps(manifest[key])[:80]}; expected "
                            "{stage of the family's spec: why (one line)}")
    return problems, tensors, documents


def _view_ok(view: Any) -> bool:
    return isinstance(view, list) and all(
        isinstance(step, list) and step and step[0] in VIEWS
        and (step[0] != "row" or (len(step) == 2 and type(step[1]) is int)) for step in view)


def _convention_ok(convention: Any) -> bool:
    """Whether one stage's ``conventions`` entry is ``{view: [...], omits: [field, ...], why:
    one line}`` (each key optional)."""
    return (isinstance(convention, dict) and _view_ok(convention.get("view", []))
            and isinstance(convention.get("omits", []), list)
            and all(isinstance(f, str) for f in convention.get("omits", []))
            and _one_line_text(convention.get("why", "")))


def _not_exposed_ok(not_exposed: Any) -> bool:
    """Whether a manifest's ``not_exposed`` (or ``unreadable``) is ``{stage: why (one
    line)}``."""
    return isinstance(not_exposed, dict) and all(map(_one_line_text, not_exposed.values()))


def _check_manifest(manifest: Any, where: Path) -> None:
    """Raise the first of :func:`manifest_problems`, if any."""
    problems = manifest_problems(manifest, where)[0]
    if problems:
        raise AudioparityError(problems[0])


def _one_line(err: BaseException) -> str:
    """An exception's message on one line (numpy's header errors span several)."""
    return " ".join(str(err).split()) or type(err).__name__


def _read_npy_header(file: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data size in bytes of a ``.npy`` file, from its header.

    Raises:
        AudioparityError: not a ``.npy`` file, an object dtype, or data of another size than
            the header says (a truncated or padded file).
    """
    try:
        with open(file, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
            else:
                raise ValueError(f"format version {version[0]}.{version[1]}; expected 1.0 or 2.0")
            data_bytes = file.stat().st_size - handle.tell()
    except (OSError, ValueError, EOFError, SyntaxError, tokenize.TokenError) as err:
        raise AudioparityError(f"{file}: unreadable .npy ({_one_line(err)})") from err
    if dtype.hasobject:
        raise AudioparityError(f"{file}: dtype {dtype} holds Python objects; expected numbers")
    expected = math.prod(shape) * dtype.itemsize
    if data_bytes != expected:
        raise AudioparityError(f"{file}: {data_bytes} data bytes, expected {expected} for shape "
                               f"{list(shape)} of {dtype} (truncated?)")
    return shape, dtype, expected


class Dump:
    """Read access to a committed dump directory.

    Raises:
        AudioparityError: the directory or its manifest is missing, unreadable or malformed
            (:func:`_check_manifest`), or a requested tensor/document is not listed.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        manifest = self.path / MANIFEST
        if not manifest.is_file():
            raise AudioparityError(f"{self.path}: not a dump directory (no {MANIFEST})")
        try:
            self.manifest: dict[str, Any] = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as err:
            raise AudioparityError(f"{manifest}: unreadable manifest ({err})") from err
        _check_manifest(self.manifest, manifest)

    @property
    def status(self) -> str:
        return self.manifest.get("status", "ok")

    @property
    def tensor_names(self) -> list[str]:
        return list(self.manifest["tensors"])

    def has(self, name: str) -> bool:
        return name in self.manifest["tensors"] or name in self.manifest.get("documents", {})

    def layout(self, name: str) -> str:
        return self.manifest["tensors"][name]["layout"]

    def tensor(self, name: str) -> np.ndarray:
        """Load tensor ``name`` (shape and dtype as listed in the manifest).

        Raises:
            AudioparityError: not listed, unreadable, or of another shape, dtype or size than
                the manifest and the ``.npy`` header say.
        """
        entry = self.manifest["tensors"].get(name)
        if entry is None:
            raise AudioparityError(f"{self.path}: no tensor {name!r} in {MANIFEST}")
        file = self.path / entry["file"]
        shape, dtype, _ = _read_npy_header(file)
        if list(shape) != entry["shape"]:
            raise AudioparityError(
                f"{file}: shape {list(shape)} differs from the manifest's {entry['shape']}"
            )
        if str(dtype) != entry["dtype"]:
            raise AudioparityError(
                f"{file}: dtype {dtype} differs from the manifest's {entry['dtype']}"
            )
        try:
            return np.load(file, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            raise AudioparityError(f"{file}: unreadable .npy ({err})") from err

    def json(self, name: str) -> Any:
        """Load JSON document ``name`` (e.g. ``decode``)."""
        file = self.manifest.get("documents", {}).get(name)
        if file is None:
            raise AudioparityError(f"{self.path}: no document {name!r} in {MANIFEST}")
        try:
            return json.loads((self.path / file).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as err:
            raise AudioparityError(f"{self.path / file}: unreadable JSON ({err})") from err


#: Manifest keys that legitimately differ between two runs of the same dump.
VOLATILE_MANIFEST_KEYS = ("seconds", GRAPH_SECONDS)
#: The manifest keys later stages read: what a dump holds and how (:func:`content_digest`).
CONTENT_MANIFEST_KEYS = ("status", "message", "tensors", "documents")
#: Suffix of the file :func:`write_digest` writes beside a dump directory.
DIGEST_SUFFIX = ".sha256"


def content_digest(path: str | os.PathLike) -> str:
    """What a later stage reads of a dump, hashed: one ``<sha256>  <file>`` line per file
    but ``manifest.json``, sorted, and one for the manifest's :data:`CONTENT_MANIFEST_KEYS`.

    Two dumps with the same digest give every later stage the same input, whatever their run
    times, library versions or notes; the workflow compares digests, not time stamps, to decide
    whether a dump that was made again changes anything downstream (docs/design.md, "Reruns").

    Raises:
        AudioparityError: not a readable dump.
    """
    dump = Dump(path)
    lines = [f"{sha256_of(file)}  {file.name}" for file in sorted(dump.path.iterdir())
             if file.is_file() and file.name != MANIFEST]
    contract = {key: dump.manifest.get(key) for key in CONTENT_MANIFEST_KEYS}
    text = json.dumps(contract, sort_keys=True, default=_json_default)
    lines.append(f"{hashlib.sha256(text.encode()).hexdigest()}  {MANIFEST}:"
                 f"{','.join(CONTENT_MANIFEST_KEYS)}")
    return "\n".join(lines) + "\n"


def write_digest(path: str | os.PathLike) -> Path:
    """Write :func:`content_digest` of the dump at ``path`` to ``<path>.sha256`` (atomic);
    return that file.

    Raises:
        AudioparityError: not a readable dump.
    """
    path = Path(path)
    digest = path.with_name(path.name + DIGEST_SUFFIX)
    write_text_atomic(digest, content_digest(path))
    return digest


def dump_differences(a: str | os.PathLike, b: str | os.PathLike) -> list[str]:
    """Every difference between two dumps of the same inputs, one line each (empty: identical).

    Compares every file but ``manifest.json`` byte for byte (``.npy`` tensors, ``.json``
    documents), naming for a differing tensor how many values differ and the largest absolute
    difference; then the manifests, key by key, less :data:`VOLATILE_MANIFEST_KEYS` (so a
    different thread count, library version, input or status is reported too).

    Raises:
        AudioparityError: either directory is not a readable dump.
    """
    dumps = Dump(a), Dump(b)
    files = [{p.name for p in d.path.iterdir() if p.is_file() and p.name != MANIFEST}
             for d in dumps]
    lines = []
    for name in sorted(files[0] | files[1]):
        if name not in files[1] or name not in files[0]:
            lines.append(f"{name}: only in {dumps[0 if name in files[0] else 1].path}")
        elif (dumps[0].path / name).read_bytes() != (dumps[1].path / name).read_bytes():
            lines.append(f"{name}: differs{_npy_difference(*(d.path / name for d in dumps))}")
    for key in sorted(set(dumps[0].manifest) | set(dumps[1].manifest)):
        values = [d.manifest.get(key) for d in dumps]
        if key not in VOLATILE_MANIFEST_KEYS and values[0] != values[1]:
            lines.append(f"{MANIFEST}: {key!r} differs: {json.dumps(values[0])[:80]} vs "
                         f"{json.dumps(values[1])[:80]}")
    return lines


def _npy_difference(a: Path, b: Path) -> str:
    """`` (k of n values, max abs diff x)`` for two ``.npy`` files of one shape, else ``""``."""
    if a.suffix != ".npy":
        return ""
    try:
        x, y = np.load(a, allow_pickle=False), np.load(b, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        return f" (unreadable: {err})"
    if x.shape != y.shape or x.dtype != y.dtype:
        return f" (shape {list(x.shape)} {x.dtype} vs {list(y.shape)} {y.dtype})"
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    unequal = ~((x64 == y64) | (np.isnan(x64) & np.isnan(y64)))
    if not unequal.any():
        return " (equal values, other bytes)"
    with np.errstate(invalid="ignore", over="ignore"):
        worst = float(np.max(np.abs(x64 - y64)[unequal]))
    return f" ({int(unequal.sum())} of {x.size} values, max abs diff {worst:.3g})"
