"""ggml runtime: backend choice, a weight store, and graph compute, over ggml-python 0.0.45.

All ctypes and ggml plumbing of the project lives here, once. Model code builds graphs with the
ggml operators (``ggml.ggml_mul_mat(g.ctx, ...)``) on tensors this module hands out, and never
touches ctypes, buffers or allocators.

Layout convention: ggml's ``ne`` is the numpy shape reversed. An array of numpy shape ``[T, D]``
(time-major, as in NeMo) becomes a ggml tensor with ``ne = [D, T]`` (``ne[0]`` is the contiguous,
fastest axis). Every public function here takes and returns numpy-order shapes.

Design (facts about ggml-python 0.0.45 measured for this project):

- :class:`Runtime` owns one compute backend (``cpu``, ``cuda`` or ``vulkan`` plus a device index),
  always a CPU backend (threads set explicitly; ggml starts with 4), and one
  ``ggml_backend_sched`` over ``[backend, cpu]``: an op the accelerator does not support falls
  back to the CPU, as in a C++ ggml runtime. A backend that is not built into this ggml-python
  raises :class:`BackendUnavailable`.
- :class:`Weights` (from :meth:`Runtime.load`, or :meth:`Runtime.upload` for a dict of arrays)
  is one backend buffer (usage ``WEIGHTS``) allocated from the weights' shapes and storage types
  ``f32|f16|bf16|q8_0`` before any value is read, then filled one block (a tensor, or a range of
  its rows) at a time, each host copy dropped before the next: a process holds its weights once,
  in their storage type. Conversion uses ggml's own ``ggml_quantize_chunk`` (which also does the
  f16/bf16 rounding), so the bytes are what a C++ converter would write. The storage type is a
  property of the tensor; graph code is the same for every type. :meth:`Weights.save` writes
  those bytes as a GGUF file and :meth:`Runtime.map` maps one back (a CPU backend computes on
  the mapped pages in place): a model converted once is loaded near free.
- :class:`State` (from :meth:`Runtime.state`) holds persistent mutable tensors (a KV cache): one
  zero-filled backend buffer that outlives graphs and is not marked as weights. Graphs write into
  it with ``ggml_cpy`` nodes added by :meth:`Graph.expand`.
- :class:`Graph` (from :meth:`Runtime.graph`) is a per-graph ``no_alloc`` context: inputs are
  numpy arrays (copied in with ``ggml_backend_tensor_set`` after allocation), any number of named
  outputs (taps) are marked ``ggml_set_output`` and read back as float32 numpy arrays, and
  side-effect nodes (writes into :class:`State`) join with :meth:`Graph.expand`. Nodes enter the
  graph in the order of the :meth:`Graph.output` / :meth:`Graph.expand` calls, which is the order
  ggml computes them in. A graph can be computed again with new input values of the same shapes
  (:meth:`Graph.set`); several graphs may stay open and be computed in turn: the scheduler
  re-allocates on each switch, after the graph is put back as it was built (the scheduler
  rewires a node's source to a copy on another backend, and frees those copies at its next
  allocation; a graph recomputed after another one ran would point at freed tensors).
- :mod:`audioparity.ggml.ops` holds the few operators whose ggml implementation depends on a
  weight's type (e.g. depthwise convolution), so model code stays free of type branches.

Usage::

    import numpy as np
    import ggml
    from audioparity.ggml import Runtime

    with Runtime("cpu", threads=2) as rt:
        w = rt.upload({"proj.weight": np.ones((3, 64), np.float32)}, {"proj.weight": "q8_0"})
        w.get("proj.bias")                                      # None: not uploaded
        with rt.graph() as g:
            x = g.input("x", np.ones((5, 64), np.float32))      # [T, D_in] -> ne [D_in, T]
            y = ggml.ggml_mul_mat(g.ctx, w["proj.weight"], x)   # ne [3, 5]
            g.output("y", y)                                     # read back as [5, 3]
            out = g.compute()                                    # {"y": ndarray [5, 3]}
        cache = rt.state({"k": ((8, 3), "f16")})                # zeros; outlives graphs
        with rt.graph() as g:
            row = g.input("row", np.ones((1, 3), np.float32))
            dst = ggml.ggml_view_2d(g.ctx, cache["k"], 3, 1, 3 * 2, 5 * 3 * 2)  # row 5
            g.expand(ggml.ggml_cpy(g.ctx, row, dst))             # a side effect, no output
            g.compute()                                          # cache.read("k")[5] == 1

Notes: a failed ggml assert aborts the process (``GGML_NO_BACKTRACE=1`` is set at import to keep
the message short); ggml-python 0.0.45 declares a wrong return type on six pointer-returning
functions, fixed at import (:func:`_fix_bindings`).
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import logging
import os
import re
import sys
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from audioparity.errors import AudioparityError
from audioparity.memory import MEMORY_LIMIT, host_free_bytes
from audioparity.storage import storage_or_fallback, storage_supported
from audioparity.vocabulary import BACKENDS
from audioparity.vocabulary import STORAGE_TYPES as STORAGE_NAMES

os.environ.setdefault("GGML_NO_BACKTRACE", "1")

import ggml  # noqa: E402  (after GGML_NO_BACKTRACE)

__all__ = [
    "STORAGE_TYPES",
    "BackendUnavailable",
    "Graph",
    "MissingWeight",
    "Runtime",
    "State",
    "Weights",
    "build_info",
    "capturing_graphs",
    "doctor",
    "numpy_shape",
    "open_runtime",
    "storage_or_fallback",
    "storage_supported",
    "tensor_name",
]

# ggml backend registry names of the backends this project drives.
_REGISTRY_NAMES = {"cpu": b"CPU", "cuda": b"CUDA", "vulkan": b"Vulkan"}
_BUILT_IN_FLAGS = {"cuda": "GGML_USE_CUDA", "vulkan": "GGML_USE_VULKAN"}

#: Storage type name -> ggml type (the names of :data:`audioparity.vocabulary.STORAGE_TYPES`).
STORAGE_TYPES = {name: getattr(ggml, f"GGML_TYPE_{name.upper()}") for name in STORAGE_NAMES}
_TYPE_NAMES = {v: k for k, v in STORAGE_TYPES.items()}
_INPUT_TYPES = {
    np.dtype(np.float32): ggml.GGML_TYPE_F32,
    np.dtype(np.float16): ggml.GGML_TYPE_F16,
    np.dtype(np.int32): ggml.GGML_TYPE_I32,
}

DEFAULT_GRAPH_SIZE = 16384


class BackendUnavailable(AudioparityError):
    """The requested backend is not built into this ggml-python, or has no such device."""


class MissingWeight(AudioparityError, KeyError):
    """``weights[name]`` (or ``state[name]``) for a name that was not allocated (a KeyError, so
    ``.get`` works)."""

    def __str__(self) -> str:
        return str(self.args[0])


def _fix_bindings() -> None:
    """Give the six pointer-returning functions mis-declared in ggml-python 0.0.45 a pointer
    return type (they truncate the 64-bit pointer to an int otherwise)."""
    for name in (
        "ggml_backend_cpu_buffer_type",
        "ggml_backend_alloc_buffer",
        "ggml_backend_cpu_buffer_from_ptr",
        "ggml_backend_sched_get_tensor_backend",
        "ggml_backend_vk_buffer_type",
        "ggml_backend_vk_host_buffer_type",
    ):
        func = getattr(ggml, name, None)
        if isinstance(func, ctypes._CFuncPtr):
            func.restype = ctypes.c_void_p


_fix_bindings()


def _ptr(array: np.ndarray) -> ctypes.c_void_p:
    return array.ctypes.data_as(ctypes.c_void_p)


def _ne(shape: tuple[int, ...]) -> ctypes.Array:
    """ggml ``ne`` (reversed numpy shape) as the int64[4] array ggml_new_tensor takes."""
    if not 1 <= len(shape) <= 4:
        raise AudioparityError(f"ggml tensors have 1 to 4 dimensions, got shape {shape}")
    return (ctypes.c_int64 * 4)(*reversed(shape), *([1] * (4 - len(shape))))


def _numpy_shape(tensor, ndim: int | None = None) -> tuple[int, ...]:
    """Numpy-order shape of a ggml tensor (``ne`` reversed), with ``ndim`` axes (default: the
    tensor's ggml_n_dims, which drops trailing size-1 ``ne`` axes)."""
    n = ggml.ggml_n_dims(tensor) if ndim is None else ndim
    ne = tensor.contents.ne
    if any(ne[i] != 1 for i in range(n, 4)):
        raise AudioparityError(
            f"tensor {tensor_name(tensor)!r} has ne {list(ne)}; cannot be read as {n} dims"
        )
    return tuple(int(ne[i]) for i in reversed(range(n)))


def tensor_name(tensor) -> str:
    """The ggml name of a tensor (as set by :class:`Weights`, :meth:`Graph.input`, ...)."""
    return ggml.ggml_get_name(tensor).decode()


def numpy_shape(tensor) -> tuple[int, ...]:
    """Numpy-order shape of a ggml tensor (``ne`` reversed, trailing size-1 ``ne`` dropped)."""
    return _numpy_shape(tensor)


#: A device line ggml-vulkan prints when it starts: ``ggml_vulkan: 0 = llvmpipe (LLVM 15.0.6,
#: 256 bits) (llvmpipe) | uma: 0 | fp16: 1 | bf16: 0 | warp size: 8 | ...``.
_VULKAN_DEVICE = re.compile(r"^ggml_vulkan: (\d+) = (.*) \(([^()]*)\) \| (.*)$")
#: Environment variables of the ggml backends (GGML_VK_DISABLE_F16, GGML_CUDA_FORCE_MMQ, ...),
#: recorded in every dump's manifest (``backend_env``): they change what a backend computes.
_BACKEND_ENV = re.compile(r"^GGML_(VK|VULKAN|CUDA|SCHED)_")


@functools.cache
def _device_properties() -> dict[str, dict[str, str]]:
    """What the backends report of their devices as ggml starts them, by ggml device name
    (``Vulkan0``): for Vulkan, the name, the driver, and the features ggml-vulkan uses (``fp16``,
    ``bf16``, ``warp size`` (the subgroup size), ``shared memory``, ``int dot``, ``matrix
    cores``). ggml-vulkan prints them to stderr at its first use, so that first use happens
    here with stderr read (and written back: the lines still reach a log)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            ggml.ggml_backend_dev_count()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read().decode(errors="replace")
    sys.stderr.write(text)
    found = {}
    for line in text.splitlines():
        match = _VULKAN_DEVICE.match(line.strip())
        if match:
            fields = dict(part.split(": ", 1) for part in match.group(4).split(" | ")
                          if ": " in part)
            found[f"Vulkan{match.group(1)}"] = {"name": match.group(2), "driver": match.group(3),
                                                **fields}
    return found


def backend_env() -> dict[str, str]:
    """The ggml backend settings in this process's environment (``GGML_VK_*``, ...)."""
    return {key: value for key, value in sorted(os.environ.items()) if _BACKEND_ENV.match(key)}


#: Why a Vulkan build may list no device on a machine without a GPU.
NO_VULKAN_DEVICE = ("ggml-vulkan lists a CPU driver (lavapipe) only when GGML_VK_VISIBLE_DEVICES "
                    "names it (e.g. GGML_VK_VISIBLE_DEVICES=0)")


def _no_device_hint(backend: str) -> str:
    """``: <why>`` for a backend that lists no device, when the reason is known; else ``""``."""
    unset = "GGML_VK_VISIBLE_DEVICES" not in os.environ
    return f": {NO_VULKAN_DEVICE}" if backend == "vulkan" and unset else ""


def _backend_built_in(backend: str) -> bool:
    flag = _BUILT_IN_FLAGS.get(backend)
    return flag is None or bool(getattr(ggml, flag, False))


def _init_backend(backend: str, device: int):
    """Initialise ``backend`` device ``device`` through ggml's backend registry."""
    reg = ggml.ggml_backend_reg_by_name(_REGISTRY_NAMES[backend])
    if not _backend_built_in(backend) or not reg:
        raise BackendUnavailable(
            f"backend {backend!r} is not built into ggml-python {ggml.__version__} "
            f"(rebuild with CMAKE_ARGS=-DGGML_{backend.upper()}=ON)"
        )
    count = ggml.ggml_backend_reg_dev_count(reg)
    if not 0 <= device < count:
        hint = _no_device_hint(backend) if count == 0 else ""
        raise BackendUnavailable(f"backend {backend!r} has {count} device(s); no device "
                                 f"{device}{hint}")
    handle = ggml.ggml_backend_dev_init(ggml.ggml_backend_reg_dev_get(reg, device), None)
    if not handle:
        raise BackendUnavailable(f"backend {backend!r} device {device} failed to initialise")
    return handle


def _dev_type_name(dev_type: int) -> str:
    return {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}.get(dev_type, str(dev_type))


def doctor() -> dict:
    """What this ggml-python can run: versions, backends built in, devices, CPU features.

    Returns a JSON-serialisable dict: ``ggml_python`` and ``ggml`` versions, ``backends``
    (name -> built in), ``devices`` (registry name, device name, description, type, memory,
    and what the backend reports of it: for Vulkan the driver, fp16, the subgroup size, ...),
    ``backend_env`` (:func:`backend_env`) and ``cpu_features`` (ggml_cpu_has_* that are set).
    """
    properties = _device_properties()
    devices = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        devices.append({
            "registry": ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(dev)).decode(),
            "name": ggml.ggml_backend_dev_name(dev).decode(),
            "description": ggml.ggml_backend_dev_description(dev).decode(),
            "type": _dev_type_name(ggml.ggml_backend_dev_type(dev)),
            "memory_total_bytes": int(total.value),
            **({"properties": properties[name]} if (name := ggml.ggml_backend_dev_name(
                dev).decode()) in properties else {}),
        })
    registries = {ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i)).decode()
                  for i in range(ggml.ggml_backend_reg_count())}
    return {
        "ggml_python": ggml.__version__,
        "ggml": ggml.GGML_VERSION,
        "backends": {
            b: _backend_built_in(b) and _REGISTRY_NAMES[b].decode() in registries
            for b in BACKENDS
        },
        "registries": sorted(registries),
        "devices": devices,
        "backend_env": backend_env(),
        "notes": _doctor_notes(registries, devices),
        **build_info(),
    }


def check_backend(backend: str, report: dict | None = None) -> str:
    """One line naming the device ``backend`` runs on (its first, as the workflow's cells do).

    Raises:
        BackendUnavailable: the backend is not built in, or lists no device (with
            :func:`doctor`'s note on why).
    """
    report = report or doctor()
    if not report["backends"][backend]:
        raise BackendUnavailable(f"backend {backend!r} is not built into ggml-python "
                                 f"{report['ggml_python']} (make setup-{backend})")
    registry = _REGISTRY_NAMES[backend].decode()
    devices = [d for d in report["devices"] if d["registry"] == registry]
    if not devices:
        raise BackendUnavailable(f"backend {backend!r} lists no device"
                                 f"{_no_device_hint(backend)}")
    device = devices[0]
    features = ", ".join(f"{k} {v}" for k, v in device.get("properties", {}).items()
                         if k != "name")
    return f"{backend}: device 0 of {len(devices)} is {device['description']}" + (
        f" ({features})" if features else "")


def _doctor_notes(registries: set[str], devices: list[dict]) -> list[str]:
    """What a reader of :func:`doctor` should know: a Vulkan build that lists no device."""
    if "Vulkan" in registries and not any(d["registry"] == "Vulkan" for d in devices):
        return [f"Vulkan is built in but lists no device{_no_device_hint('vulkan')}"]
    return []


def build_info() -> dict:
    """Which ggml build computes: versions and the ``ggml_cpu_has_*`` features that are set
    (``llamafile`` and ``blas`` change the f16/f32 matmul kernels, hence the numerics). Every
    ggml dump records it in its manifest (``ggml_build``)."""
    features = sorted(
        name.removeprefix("ggml_cpu_has_")
        for name in dir(ggml)
        if name.startswith("ggml_cpu_has_") and _safe_flag(getattr(ggml, name))
    )
    return {"ggml_python": ggml.__version__, "ggml": ggml.GGML_VERSION, "cpu_features": features}


def _safe_flag(func) -> bool:
    try:
        return bool(func())
    except (RuntimeError, TypeError, AttributeError):
        return False


class Runtime:
    """One compute backend + the CPU backend + a scheduler; the context for weights and graphs.

    Args:
        backend: ``cpu``, ``cuda`` or ``vulkan``.
        device: device index within that backend (ignored for ``cpu``).
        threads: CPU threads (always set on the CPU backend; ggml's default is 4).
        graph_size: the most nodes (and, separately, leafs) one graph may hold.

    Raises:
        BackendUnavailable: the backend is not built in, or has no device ``device``.
    """

    def __init__(self, backend: str = "cpu", device: int = 0, threads: int = 1,
                 graph_size: int = DEFAULT_GRAPH_SIZE) -> None:
        if threads < 1:
            raise AudioparityError(f"threads must be >= 1, got {threads}")
        if backend not in BACKENDS:
            raise AudioparityError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
        self.backend_name = backend
        self.device = device
        self.threads = threads
        self.graph_size = graph_size
        handles = [] if backend == "cpu" else [_init_backend(backend, device)]
        self._cpu = ggml.ggml_backend_cpu_init()
        ggml.ggml_backend_cpu_set_n_threads(self._cpu, threads)
        handles.append(self._cpu)
        self._backends = handles
        self.backend = handles[0]  # where weights live and ops run
        array = (ctypes.c_void_p * len(handles))(*handles)
        self._sched = ggml.ggml_backend_sched_new(array, None, len(handles), graph_size,
                                                  False, False)
        self._active: Graph | None = None  # the graph whose allocation the scheduler holds
        self._persistent: set[int] = set()  # buffers of weights and state (outlive graphs)
        #: What each graph is handed to at its first compute (:func:`capturing_graphs`), or
        #: None.
        self.capture = None
        self._finalizer = weakref.finalize(self, _free_runtime, self._sched, list(handles))

    @property
    def device_description(self) -> str:
        """Human-readable name of the compute device (for manifests)."""
        dev = ggml.ggml_backend_get_device(self.backend)
        return ggml.ggml_backend_dev_description(dev).decode()

    def upload(self, arrays: Mapping[str, np.ndarray], storage: Mapping[str, str]) -> Weights:
        """Upload named arrays once into one backend buffer (see :class:`Weights`): each array
        is one block starting at row 0."""
        return self.load({name: array.shape for name, array in arrays.items()}, storage,
                         ((name, 0, array) for name, array in arrays.items()))

    def load(self, shapes: Mapping[str, tuple[int, ...]], storage: Mapping[str, str],
             blocks: Iterable[tuple[str, int, np.ndarray]]) -> Weights:
        """Allocate weights from their numpy ``shapes`` and ``storage`` types, then fill them
        from ``blocks`` streamed one at a time (see :class:`Weights`)."""
        return Weights(self, shapes, storage, blocks)

    def map(self, path: Path, shapes: Mapping[str, tuple[int, ...]],
            storage: Mapping[str, str]) -> Weights:
        """Weights from a GGUF file :meth:`Weights.save` wrote, memory-mapped (see
        :class:`Weights`); it must hold exactly ``shapes`` in ``storage`` types."""
        return Weights.mapped(self, path, shapes, storage)

    def state(self, specs: Mapping[str, tuple[tuple[int, ...], str]]) -> State:
        """Allocate zero-filled persistent tensors, ``name -> (numpy shape, storage type)``
        (see :class:`State`)."""
        return State(self, specs)

    def graph(self, max_tensors: int | None = None) -> Graph:
        """A new, empty graph bound to this runtime (use as a context manager)."""
        return Graph(self, max_tensors or self.graph_size)

    def close(self) -> None:
        """Free the scheduler and backends (weights and graphs must not be used after)."""
        self._finalizer()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_runtime(writer, backend: str, device: int = 0, threads: int = 1) -> Runtime | None:
    """The runtime a ggml dump computes on, what it is recorded in the dump's manifest
    (``device_description`` and ``ggml_build``, :func:`build_info`).

    Args:
        writer: the dump being written (an :class:`audioparity.artifacts.DumpWriter`).
        backend, device, threads: as :class:`Runtime` takes them.

    Returns:
        The runtime (use it as a context manager), or None when the backend is not built into
        this ggml or has no such device: the dump is then marked ``unavailable`` with the
        reason, and the caller writes nothing more (the dump is still a valid one).
    """
    writer.manifest["ggml_build"] = build_info()
    writer.manifest["backend_env"] = backend_env()
    properties = _device_properties()
    try:
        runtime = Runtime(backend, device=device, threads=threads)
    except BackendUnavailable as err:
        writer.set_status("unavailable", str(err))
        logging.getLogger("audioparity").info("%s: unavailable (%s)", writer.output_dir, err)
        return None
    writer.manifest["device_description"] = runtime.device_description
    device_name = ggml.ggml_backend_dev_name(ggml.ggml_backend_get_device(runtime.backend))
    if device_name.decode() in properties:
        writer.manifest["device_properties"] = properties[device_name.decode()]
    capture = _CAPTURE.get()
    if capture is not None:
        runtime.capture = capture(writer)
    return runtime


_CAPTURE = contextvars.ContextVar("audioparity_graph_capture", default=None)


@contextmanager
def capturing_graphs(capture) -> Iterator[None]:
    """Within the block, every runtime :func:`open_runtime` opens gets ``capture(writer)`` as
    its :attr:`Runtime.capture`: an object whose ``save(gf, inputs=..., outputs=..., kinds=...)``
    each graph calls once, at its first compute (:class:`audioparity.ggml.graphs.GraphCapture`,
    for a drill-down). The runtime itself imports none of it, so a dump's code inputs stay the
    runtime's."""
    token = _CAPTURE.set(capture)
    try:
        yield
    finally:
        _CAPTURE.reset(token)


def _free_runtime(sched, handles) -> None:
    ggml.ggml_backend_sched_free(sched)
    for handle in handles:
        ggml.ggml_backend_free(handle)


def _to_storage(array: np.ndarray, type_: int) -> np.ndarray:
    """The bytes of a float32 array converted by ``ggml_quantize_chunk`` to ``type_`` (rows =
    last numpy axis, ggml ``ne[0]``)."""
    src = np.ascontiguousarray(array, dtype=np.float32)
    if type_ == ggml.GGML_TYPE_F32:
        return src
    n_per_row = src.shape[-1]
    nrows = src.size // n_per_row
    dst = np.empty(ggml.ggml_row_size(type_, n_per_row) * nrows, dtype=np.uint8)
    src_ptr = src.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    written = ggml.ggml_quantize_chunk(type_, src_ptr, _ptr(dst), 0, nrows, n_per_row, None)
    if written != dst.nbytes:
        raise AudioparityError(f"ggml_quantize_chunk wrote {written} bytes, expected {dst.nbytes}")
    return dst


class _Tensors(Mapping):
    """Named tensors in one buffer of the runtime's compute backend, each in its own storage
    type (the common part of :class:`Weights` and :class:`State`).

    ``tensors[name]`` is the ggml tensor (``ne`` = numpy shape reversed) to use in graphs.

    Raises:
        AudioparityError: a name without a storage type, an unknown type, a shape the type cannot
            hold (q8_0 needs the last axis to be a multiple of 32), or a failed allocation.
    """

    #: What a tensor of this kind is called in messages.
    _what = "tensor"

    def __init__(self, runtime: Runtime, shapes: Mapping[str, tuple[int, ...]],
                 storage: Mapping[str, str], host: tuple[int, int, dict[str, int]] | None = None
                 ) -> None:
        """``host``: ``(address, size, name -> address)`` of memory that already holds every
        tensor's bytes (a mapped file), used in place by a CPU runtime instead of a new
        buffer."""
        self._runtime = runtime
        self._storage: dict[str, str] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._tensors = {}
        for name, shape in shapes.items():
            kind = storage.get(name)
            if kind is None:
                raise AudioparityError(f"{self._what} {name!r} has no storage type")
            if not storage_supported(kind, shape):
                raise AudioparityError(
                    f"{self._what} {name!r} of shape {list(shape)} cannot be stored as {kind}: "
                    f"last axis must be a multiple of "
                    f"{ggml.ggml_blck_size(STORAGE_TYPES[kind])}"
                )
            self._storage[name] = kind
            self._shapes[name] = tuple(int(n) for n in shape)
        params = ggml.ggml_init_params(
            mem_size=ggml.ggml_tensor_overhead() * max(len(shapes), 1),
            mem_buffer=None, no_alloc=True,
        )
        self._ctx = ggml.ggml_init(params)
        for name, shape in self._shapes.items():
            tensor = ggml.ggml_new_tensor(self._ctx, STORAGE_TYPES[self._storage[name]],
                                          len(shape), _ne(shape))
            ggml.ggml_set_name(tensor, name.encode()[: ggml.GGML_MAX_NAME - 1])
            self._tensors[name] = tensor
        self._buffer = None
        if shapes and host is not None and runtime.backend_name == "cpu":
            start, size, addresses = host
            self._buffer = ggml.ggml_backend_cpu_buffer_from_ptr(ctypes.c_void_p(start), size)
            for name, tensor in self._tensors.items():
                ggml.ggml_backend_tensor_alloc(self._buffer, tensor,
                                               ctypes.c_void_p(addresses[name]))
            runtime._persistent.add(self._buffer)
        elif shapes:
            self._buffer = ggml.ggml_backend_alloc_ctx_tensors(self._ctx, runtime.backend)
            if not self._buffer:
                raise AudioparityError(f"could not allocate {len(shapes)} {self._what}s on "
                                       f"{runtime.backend_name}")
            runtime._persistent.add(self._buffer)
        self._finalizer = weakref.finalize(self, _free_tensors, self._ctx, self._buffer,
                                           runtime._persistent)

    def __getitem__(self, name: str):
        try:
            return self._tensors[name]
        except KeyError:
            raise MissingWeight(f"no {self._what} named {name!r}") from None

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def storage(self, name: str) -> str:
        """Storage type of tensor ``name`` (``f32|f16|bf16|q8_0``)."""
        return self._storage[name]

    def shape(self, name: str) -> tuple[int, ...]:
        """Numpy shape of tensor ``name`` (ggml ``ne`` reversed)."""
        return self._shapes[name]

    @property
    def nbytes(self) -> int:
        """Size of the backend buffer holding all tensors."""
        return ggml.ggml_backend_buffer_get_size(self._buffer) if self._buffer else 0

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` read back from the backend and dequantized to float32 (ggml's own
        ``to_float``), in its numpy shape. For tests and diagnostics."""
        return tensor_values(self[name]).reshape(self._shapes[name])

    def close(self) -> None:
        """Free the buffer and context."""
        self._finalizer()


class Weights(_Tensors):
    """Named weight tensors in one backend buffer (usage ``WEIGHTS``), each in its own storage
    type, filled by streaming.

    ``weights[name]`` is the ggml tensor (``ne`` = numpy shape reversed) to use in graphs. The
    buffer is allocated from ``shapes`` and ``storage`` before any value is read; then each
    block of ``blocks`` is converted from float32 on the host with ggml's quantize functions
    (rows = last numpy axis; a block type's blocks never cross a row) and copied to its byte
    offset, and the host copy is dropped before the next block is drawn. So the host holds one
    block at a time beside the buffer; nothing is re-uploaded per graph.

    Args:
        runtime: the runtime whose compute backend holds the buffer.
        shapes: name -> numpy shape of every weight.
        storage: name -> ``f32|f16|bf16|q8_0`` for every name in ``shapes``.
        blocks: ``(name, first row, array)``: ``array`` holds rows ``first row ...`` of the
            weight viewed as ``[rows, shape[-1]]`` (any float dtype, converted to float32 first,
            which is exact for f16/bf16/f32 sources; shape ``[n, *shape[1:]]`` or ``[n,
            shape[-1]]``). A whole weight is one block at row 0; together the blocks must cover
            every row of every weight exactly once.
        host: instead of ``blocks``, ``(address, size, name -> address)`` of host memory that
            holds every weight's bytes in its storage type already (:meth:`mapped`).

    Raises:
        AudioparityError: a name without a storage type, an unknown type, or a shape the type
            cannot hold (q8_0 needs the last axis to be a multiple of 32); a block of an unknown
            name, of the wrong row length, outside its weight or overlapping another; or a
            weight whose rows the blocks do not all cover.
    """

    _what = "weight"

    def __init__(self, runtime: Runtime, shapes: Mapping[str, tuple[int, ...]],
                 storage: Mapping[str, str],
                 blocks: Iterable[tuple[str, int, np.ndarray]] = (),
                 host: tuple[int, int, dict[str, int]] | None = None) -> None:
        super().__init__(runtime, shapes, storage, host)
        if self._buffer:
            ggml.ggml_backend_buffer_set_usage(self._buffer,
                                               ggml.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        if host is not None:  # the bytes are there already: used in place, or copied once
            if runtime.backend_name != "cpu":
                for name, tensor in self._tensors.items():
                    ggml.ggml_backend_tensor_set(tensor, ctypes.c_void_p(host[2][name]), 0,
                                                 ggml.ggml_nbytes(tensor))
            return
        filled = dict.fromkeys(self._shapes, 0)
        for name, first, array in blocks:
            self._set_rows(name, first, array, filled)
            del array  # the host copy goes before the next block is read
        missing = [name for name, shape in self._shapes.items()
                   if filled[name] != _n_rows(shape)]
        if missing:
            raise AudioparityError(
                f"weight {missing[0]!r} {list(self._shapes[missing[0]])}: "
                f"{filled[missing[0]]} of {_n_rows(self._shapes[missing[0]])} rows uploaded")

    def _set_rows(self, name: str, first: int, array: np.ndarray, filled: dict[str, int]) -> None:
        """Convert one block and copy it to its rows of weight ``name``."""
        if name not in self._shapes:
            raise AudioparityError(f"weight {name!r} was not allocated")
        shape = self._shapes[name]
        rows = array.size // shape[-1] if array.ndim else 0
        if array.shape[-1:] != shape[-1:] or array.size != rows * shape[-1]:
            raise AudioparityError(f"weight {name!r}: block of shape {list(array.shape)}; "
                                   f"expected rows of {shape[-1]} values")
        if first != filled[name] or first + rows > _n_rows(shape):
            raise AudioparityError(f"weight {name!r}: block of rows {first}..{first + rows} "
                                   f"after {filled[name]} of {_n_rows(shape)} rows")
        tensor = self._tensors[name]
        data = _to_storage(array, tensor.contents.type)
        row_bytes = ggml.ggml_row_size(tensor.contents.type, shape[-1])
        if data.nbytes != rows * row_bytes:
            raise AudioparityError(f"weight {name!r}: {data.nbytes} bytes for {rows} rows of "
                                   f"{row_bytes} bytes")
        ggml.ggml_backend_tensor_set(tensor, _ptr(data), first * row_bytes, data.nbytes)
        filled[name] = first + rows

    @classmethod
    def mapped(cls, runtime: Runtime, path: Path, shapes: Mapping[str, tuple[int, ...]],
               storage: Mapping[str, str]) -> Weights:
        """The weights a GGUF file holds (:meth:`save`), memory-mapped read-only: a CPU runtime
        computes on the mapped bytes in place (nothing is read until a graph touches it, and
        processes mapping one file share its pages); another backend copies each tensor from
        the mapping once.

        Raises:
            AudioparityError: an unreadable file, or one that does not hold exactly ``shapes``
                (numpy order) in the ``storage`` types (one line naming the first tensor that
                differs).
        """
        import gguf

        try:
            reader = gguf.GGUFReader(path)
        except (OSError, ValueError) as err:
            raise AudioparityError(f"weights file {path}: unreadable ({err})") from None
        found = {t.name: t for t in reader.tensors}
        for name in sorted(set(shapes) | set(found)):
            tensor = found.get(name)
            want = (tuple(shapes[name]), storage[name]) if name in shapes else None
            have = None if tensor is None else (
                tuple(int(n) for n in reversed(tensor.shape)),
                _TYPE_NAMES.get(int(tensor.tensor_type), tensor.tensor_type.name))
            if have != want:
                raise AudioparityError(
                    f"weights file {path}: tensor {name!r} is "
                    f"{'absent' if have is None else f'{list(have[0])} {have[1]}'}; the model "
                    f"wants {'none' if want is None else f'{list(want[0])} {want[1]}'} "
                    "(convert it again)")
        base = reader.data.ctypes.data
        addresses = {name: base + found[name].data_offset for name in shapes}
        start = min(addresses.values(), default=base)
        end = max((addresses[n] + found[n].n_bytes for n in shapes), default=base)
        weights = cls(runtime, shapes, storage, host=(start, end - start, addresses))
        weights._mapping = reader.data  # the mapping lives as long as the weights
        return weights

    def save(self, path: Path, metadata: Mapping[str, str] | None = None) -> None:
        """Write the weights, each in its storage type (the bytes ggml holds), as a GGUF file
        (architecture ``audioparity-weights``, string ``metadata`` under ``audioparity.*``),
        atomically: a file at ``path`` is always complete."""
        import gguf

        path = Path(path)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        writer = gguf.GGUFWriter(str(partial), arch="audioparity-weights")
        for key, value in (metadata or {}).items():
            writer.add_string(f"audioparity.{key}", value)
        for name, tensor in self._tensors.items():
            shape, type_ = self._shapes[name], tensor.contents.type
            writer.add_tensor_info(name, (*shape[:-1], ggml.ggml_row_size(type_, shape[-1])),
                                   np.dtype(np.uint8), ggml.ggml_nbytes(tensor),
                                   raw_dtype=gguf.GGMLQuantizationType(type_))
        try:
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for tensor in self._tensors.values():
                writer.write_tensor_data(tensor_bytes(tensor))
            writer.close()
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)


def _n_rows(shape: tuple[int, ...]) -> int:
    """Rows of a weight of numpy ``shape`` (all axes but the last)."""
    return int(np.prod(shape[:-1], dtype=np.int64))


class State(_Tensors):
    """Persistent mutable tensors (e.g. a KV cache) in one zero-filled backend buffer.

    Unlike :class:`Weights` the buffer is not marked as weights (usage ``ANY``): graphs write
    into these tensors, through a ``ggml_cpy`` into a view added with :meth:`Graph.expand`, and
    what they write stays for the next graph. ``state[name]`` is the ggml tensor (``ne`` = numpy
    shape reversed); :meth:`read` reads it back.

    Args:
        runtime: the runtime whose compute backend holds the buffer.
        specs: name -> ``(numpy shape, storage type)``; the type is one of ``f32|f16|bf16|q8_0``
            (a KV cache uses ``f32`` or ``f16``).

    Raises:
        AudioparityError: an unknown storage type, or a shape the type cannot hold.
    """

    _what = "state tensor"

    def __init__(self, runtime: Runtime,
                 specs: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
        super().__init__(runtime, {name: shape for name, (shape, _) in specs.items()},
                         {name: kind for name, (_, kind) in specs.items()})
        if self._buffer:
            ggml.ggml_backend_buffer_clear(self._buffer, 0)


def _free_tensors(ctx, buffer, persistent: set[int]) -> None:
    if buffer:
        persistent.discard(buffer)
        ggml.ggml_backend_buffer_free(buffer)
    ggml.ggml_free(ctx)


def _free_bytes(handle) -> int | None:
    """Memory free for buffers of backend ``handle``: a CPU's :func:`host_free_bytes`, a
    device's what ``ggml_backend_dev_memory`` reports; None when unknown."""
    device = ggml.ggml_backend_get_device(handle)
    if ggml.ggml_backend_dev_type(device) != ggml.GGML_BACKEND_DEVICE_TYPE_CPU:
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        return free.value or None
    return host_free_bytes()


def address(pointer) -> int | None:
    """The address a ctypes pointer (a ggml tensor) holds, None for NULL: an element read from
    a ctypes array aliases the array's slot, so a later write to the slot would change it."""
    return ctypes.cast(pointer, ctypes.c_void_p).value


def tensor_bytes(tensor) -> np.ndarray:
    """The bytes of a contiguous tensor, read back from its backend (``ggml_nbytes`` of them)."""
    raw = np.empty(ggml.ggml_nbytes(tensor), dtype=np.uint8)
    ggml.ggml_backend_tensor_get(tensor, _ptr(raw), 0, raw.nbytes)
    return raw


def tensor_values(tensor) -> np.ndarray:
    """A contiguous tensor's values, flat: float32 dequantized by ggml's own ``to_float`` (f16,
    bf16, q8_0), int32 as they are."""
    raw = tensor_bytes(tensor)
    type_ = tensor.contents.type
    if type_ in (ggml.GGML_TYPE_F32, ggml.GGML_TYPE_I32):
        return raw.view(np.float32 if type_ == ggml.GGML_TYPE_F32 else np.int32)
    out = np.empty(int(np.prod([int(n) for n in tensor.contents.ne])), dtype=np.float32)
    traits = ggml.ggml_get_type_traits(type_).contents
    traits.to_float(_ptr(raw), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size)
    return out


class Graph:
    """One compute graph: a ``no_alloc`` context for its tensors, inputs, and named outputs.

    Build with ggml operators on :attr:`ctx`, declare inputs with :meth:`input`, outputs with
    :meth:`output` and side-effect nodes with :meth:`expand`, then :meth:`compute`. Each
    :meth:`output` / :meth:`expand` call appends the tensor and whatever it depends on that is
    not in the graph yet (``ggml_build_forward_expand``), so nodes are computed in the order of
    those calls. Use as a context manager (frees the context).
    """

    def __init__(self, runtime: Runtime, max_tensors: int) -> None:
        self._runtime = runtime
        params = ggml.ggml_init_params(
            mem_size=ggml.ggml_tensor_overhead() * max_tensors
            + ggml.ggml_graph_overhead_custom(runtime.graph_size, False),
            mem_buffer=None, no_alloc=True,
        )
        self.ctx = ggml.ggml_init(params)
        self._inputs: dict[str, tuple[object, np.ndarray]] = {}
        self._outputs: dict[str, tuple[object, int]] = {}
        self._gf = ggml.ggml_new_graph_custom(self.ctx, runtime.graph_size, False)
        self._expanded = False
        self._computed = False
        self._sources: dict[int, tuple[int | None, ...]] | None = None  # node sources as built
        self._saved = False
        self._checked = False  # compute buffers checked against the memory free
        self._finalizer = weakref.finalize(self, ggml.ggml_free, self.ctx)

    def input(self, name: str, array: np.ndarray):
        """A graph input holding ``array`` (float32, float16 or int32; numpy shape, ggml ``ne``
        reversed). Also the way to upload a host-precomputed constant (e.g. ``pos_emb``).

        Every input must be used by an output or an expanded node: :meth:`compute` raises
        otherwise (ggml leaves an unused input unallocated)."""
        if name in self._inputs:
            raise AudioparityError(f"graph input {name!r} declared twice")
        array = np.ascontiguousarray(array)
        if array.dtype not in _INPUT_TYPES:
            raise AudioparityError(
                f"graph input {name!r} has dtype {array.dtype}; expected float32, float16 or int32"
            )
        tensor = ggml.ggml_new_tensor(self.ctx, _INPUT_TYPES[array.dtype], array.ndim,
                                      _ne(array.shape))
        ggml.ggml_set_name(tensor, name.encode())
        ggml.ggml_set_input(tensor)
        self._inputs[name] = (tensor, array)
        return tensor

    def set(self, name: str, array: np.ndarray) -> None:
        """New values for input ``name`` (same shape and dtype) before the next :meth:`compute`."""
        tensor, old = self._inputs[name]
        array = np.ascontiguousarray(array)
        if array.shape != old.shape or array.dtype != old.dtype:
            raise AudioparityError(
                f"graph input {name!r}: got {array.dtype} {list(array.shape)}, "
                f"expected {old.dtype} {list(old.shape)}"
            )
        self._inputs[name] = (tensor, array)

    def output(self, name: str, tensor, ndim: int | None = None):
        """Mark ``tensor`` as output ``name``; :meth:`compute` returns it as a float32 array of
        ``ndim`` numpy axes (default: ggml_n_dims). Non-contiguous views are made contiguous and
        non-f32 tensors cast to f32 inside the graph. The output and what it depends on join
        the graph now (after the nodes of earlier :meth:`output` / :meth:`expand` calls).
        Returns the output tensor."""
        if name in self._outputs:
            raise AudioparityError(f"graph output {name!r} declared twice")
        self._check_open(f"graph output {name!r}")
        if not ggml.ggml_is_contiguous(tensor):
            tensor = ggml.ggml_cont(self.ctx, tensor)
        if tensor.contents.type != ggml.GGML_TYPE_F32:
            tensor = ggml.ggml_cast(self.ctx, tensor, ggml.GGML_TYPE_F32)
        ggml.ggml_set_name(tensor, name.encode())
        ggml.ggml_set_output(tensor)
        ggml.ggml_build_forward_expand(self._gf, tensor)
        self._outputs[name] = (tensor, ndim)
        return tensor

    def expand(self, tensor):
        """Add ``tensor`` and what it depends on to the graph for its side effect, without
        reading it back (``ggml_build_forward_expand``): a ``ggml_cpy`` into a view of a
        :class:`State` tensor, e.g. a KV-cache write.

        The node is computed after everything added before this call and before everything
        added after it. A write has no data dependency on a later read of the same state (the
        read is a view of the state tensor, not of the copy), so expand the write before
        building the output that reads it (add the KV-cache copy before the
        attention). Returns ``tensor``.
        """
        self._check_open("graph node")
        ggml.ggml_build_forward_expand(self._gf, tensor)
        self._expanded = True
        return tensor

    def _check_open(self, what: str) -> None:
        if self._computed:
            raise AudioparityError(f"{what} declared after the first compute")

    @property
    def n_nodes(self) -> int:
        """Number of nodes in the graph so far."""
        return ggml.ggml_graph_n_nodes(self._gf)

    def compute(self) -> dict[str, np.ndarray]:
        """Run the graph; return every output by name (float32, numpy order; empty for a
        graph of expanded nodes only).

        The first call closes the graph to new nodes; later calls reuse it with the current
        input values (:meth:`set`).

        Raises:
            AudioparityError: the graph has neither outputs nor expanded nodes; it cannot be
                allocated; an input is used by no output or expanded node (ggml leaves it
                unallocated and would abort copying into it; an unused input is a wiring
                error, e.g. a mask built but never applied, so it is reported, not skipped);
                or the backend reports a failed compute.
        """
        rt = self._runtime
        if not self._outputs and not self._expanded:
            raise AudioparityError("graph has no outputs and no expanded nodes")
        self._computed = True
        if rt.capture is not None and not self._saved:  # as built: a backend may reorder
            self._save(rt.capture)
        if rt._active is not self:
            ggml.ggml_backend_sched_reset(rt._sched)
            self._as_built()
            free = None if self._checked else [_free_bytes(h) for h in rt._backends]
            if not ggml.ggml_backend_sched_alloc_graph(rt._sched, self._gf):
                raise AudioparityError(f"could not allocate a graph of {self.n_nodes} nodes "
                                       f"on {rt.backend_name}")
            if free is not None:
                self._check_memory(free)
            rt._active = self
        for name, (tensor, array) in self._inputs.items():
            if not tensor.contents.buffer:  # the scheduler allocates only what the graph holds
                raise AudioparityError(
                    f"graph input {name!r} ({array.dtype} {list(array.shape)}) is not used by "
                    f"any output or expanded node; use it or do not declare it"
                )
            ggml.ggml_backend_tensor_set(tensor, _ptr(array), 0, array.nbytes)
        status = ggml.ggml_backend_sched_graph_compute(rt._sched, self._gf)
        if status != ggml.GGML_STATUS_SUCCESS:
            raise AudioparityError(f"graph compute on {rt.backend_name} failed (status {status})")
        results = {}
        for name, (tensor, ndim) in self._outputs.items():
            out = np.empty(_numpy_shape(tensor, ndim), dtype=np.float32)
            ggml.ggml_backend_tensor_get(tensor, _ptr(out), 0, out.nbytes)
            results[name] = out
        return results

    def _check_memory(self, free: list[int | None]) -> None:
        """Refuse the graph, before its first compute touches a page, when a backend's compute
        buffer (just allocated: address space on the host) exceeds the memory that backend had
        free before (``free``, per backend of the runtime: the host's ``MemAvailable`` or
        :data:`MEMORY_LIMIT`, a device's free memory; None: unknown).

        The buffers are sized by ``ggml_backend_sched_alloc_graph`` itself, not by a
        ``ggml_backend_sched_reserve`` first: reserving and then allocating the same graph
        corrupted the heap now and then on Vulkan (double free, segfault: 4 runs in 40 of the
        Whisper drill-down on lavapipe, none in 40 without it).
        """
        rt = self._runtime
        for handle, available in zip(rt._backends, free, strict=True):
            need = ggml.ggml_backend_sched_get_buffer_size(rt._sched, handle)
            if available is not None and need > available:
                where = ggml.ggml_backend_name(handle).decode()
                raise AudioparityError(
                    f"a graph of {self.n_nodes} nodes needs {need / 2**20:.0f} MiB of compute "
                    f"buffers on {where}, more than the {available / 2**20:.0f} MiB free "
                    f"(machine or {MEMORY_LIMIT}): the input is too long for this memory")
        self._checked = True

    def _save(self, capture) -> None:
        """Hand this graph as built, with the values its inputs get now, to ``capture``
        (:func:`capturing_graphs`); a leaf that is no input is a ``weight`` (in a buffer of
        usage WEIGHTS) or ``state``."""
        def kind(tensor) -> str:
            buffer = tensor.contents.buffer
            weights = ggml.ggml_backend_buffer_get_usage(buffer) == (
                ggml.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
            return "weight" if weights else "state"

        capture.save(self._gf, inputs=self._inputs,
                     outputs={name: tensor for name, (tensor, _) in self._outputs.items()},
                     kinds=kind)
        self._saved = True

    def _as_built(self) -> None:
        """Put the graph back as it was built before the scheduler allocates it (again).

        At its first allocation the graph's node sources are recorded. At a later one (another
        graph ran in between) each node gets those sources back, since the scheduler had
        rewired some to its copies on the other backend, which it has freed since; and every
        tensor of this graph's context that is not a view of the runtime's weights or state is
        unplaced, since the allocator takes a tensor with ``data`` as allocated and the
        scheduler a tensor with a ``buffer`` as living there, and both are stale now.
        """
        nodes = [ggml.ggml_graph_node(self._gf, i) for i in range(self.n_nodes)]
        if self._sources is None:  # by address: a backend may reorder the nodes it computes
            self._sources = {address(node): tuple(address(source)
                                                  for source in node.contents.src)
                             for node in nodes}
            return
        for node in nodes:
            for j, source in enumerate(self._sources[address(node)]):
                node.contents.src[j] = ctypes.cast(source, ctypes.POINTER(ggml.ggml_tensor))
        persistent = self._runtime._persistent
        tensor = ggml.ggml_get_first_tensor(self.ctx)
        while tensor:
            if tensor.contents.buffer is not None and tensor.contents.buffer not in persistent:
                tensor.contents.data = None
                tensor.contents.buffer = None
            tensor = ggml.ggml_get_next_tensor(self.ctx, tensor)

    def close(self) -> None:
        """Free the graph context (the scheduler's allocation is dropped with it)."""
        if self._runtime._active is self:
            self._runtime._active = None
        self._finalizer()

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
