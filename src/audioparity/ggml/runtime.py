"""The runtime a port computes on: one compute backend, the CPU backend and a scheduler
(:class:`Runtime`), opened for a dump by :func:`open_runtime`.

:class:`Runtime` owns one compute backend (``cpu``, ``cuda`` or ``vulkan`` plus a device index),
always a CPU backend (threads set explicitly; ggml starts with 4), and one
``ggml_backend_sched`` over ``[backend, cpu]``: an op the accelerator does not support falls
back to the CPU, as in a C++ ggml runtime. A backend that is not built into this ggml-python
raises :class:`~audioparity.ggml.backends.BackendUnavailable`. It hands out the weights and
state (:mod:`audioparity.ggml.tensors`) and the graphs (:mod:`audioparity.ggml.graph`) that
compute on it.
"""

from __future__ import annotations

import contextvars
import ctypes
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import BACKENDS
from audioparity.dumping.artifacts import GRAPH_SECONDS, OPS_ON_CPU
from audioparity.ggml.backends import (
    BackendUnavailable,
    backend_env,
    build_info,
    device_properties,
    init_backend,
)
from audioparity.ggml.bindings import ggml
from audioparity.ggml.graph import Graph
from audioparity.ggml.tensors import State, Weights

DEFAULT_GRAPH_SIZE = 16384
#: The :data:`GRAPH_SECONDS` key of graphs computed outside every stage of a dump.
UNSTAGED = "unstaged"


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
        handles = [] if backend == "cpu" else [init_backend(backend, device)]
        self._cpu = ggml.ggml_backend_cpu_init()
        ggml.ggml_backend_cpu_set_n_threads(self._cpu, threads)
        handles.append(self._cpu)
        self._backends = handles
        self.backend = handles[0]  # where weights live and ops run
        array = (ctypes.c_void_p * len(handles))(*handles)
        self._sched = ggml.ggml_backend_sched_new(array, None, len(handles), graph_size,
                                                  False, False)
        self._active: Graph | None = None  # the graph whose allocation the scheduler holds
        #: What each graph is handed to at its first compute (:func:`capturing_graphs`), or
        #: None.
        self.capture = None
        #: Called at every compute of a graph, on a backend other than the CPU, with the graph
        #: and the ops of its nodes the backend does not support (op name -> nodes, found
        #: once per graph), which the scheduler runs on the CPU; None: not checked.
        self.on_cpu: Callable[[Graph, Mapping[str, int]], None] | None = None
        #: Called after every graph compute with the seconds the backend computed it
        #: (``ggml_backend_sched_graph_compute``, which waits for the device); None: not timed.
        self.on_computed: Callable[[float], None] | None = None
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
    (``device_description`` and ``ggml_build``, :func:`build_info`), the seconds its graphs
    compute per stage (:data:`~audioparity.dumping.artifacts.GRAPH_SECONDS`), and on a backend
    other than the CPU the ops it runs on the CPU
    (:data:`~audioparity.dumping.artifacts.OPS_ON_CPU`).

    Args:
        writer: the dump being written (an :class:`audioparity.dumping.artifacts.DumpWriter`).
        backend, device, threads: as :class:`Runtime` takes them.

    Returns:
        The runtime (use it as a context manager), or None when the backend is not built into
        this ggml or has no such device: the dump is then marked ``unavailable`` with the
        reason, and the caller writes nothing more (the dump is still a valid one).
    """
    writer.manifest["ggml_build"] = build_info()
    writer.manifest["backend_env"] = backend_env()
    properties = device_properties()
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
    runtime.on_computed = lambda seconds: record_graph_seconds(writer.manifest, writer.running,
                                                               seconds)
    if backend != "cpu":
        counted: set[tuple[str | None, int]] = set()

        def on_cpu(graph: Graph, ops: Mapping[str, int]) -> None:
            if (writer.running, graph.serial) not in counted:  # a graph once per phase
                counted.add((writer.running, graph.serial))
                record_ops_on_cpu(writer.manifest, writer.running, ops)

        runtime.on_cpu = on_cpu
    return runtime



def record_graph_seconds(manifest: dict, phase: str | None, seconds: float) -> None:
    """Add ``seconds`` of one graph compute in ``phase`` (None: outside every stage) to
    ``manifest``'s :data:`GRAPH_SECONDS`."""
    totals = manifest.setdefault(GRAPH_SECONDS, {})
    key = phase or UNSTAGED
    totals[key] = round(totals.get(key, 0.0) + seconds, 6)


def record_ops_on_cpu(manifest: dict, phase: str | None, ops: Mapping[str, int]) -> None:
    """Add ``ops`` (op name -> nodes of one graph) computed in ``phase`` to ``manifest``'s
    :data:`OPS_ON_CPU`, each op's count summed over the graphs the phase computes (a graph
    computed again in the phase counts once)."""
    entries = manifest.setdefault(OPS_ON_CPU, [])
    for op, count in ops.items():
        entry = next((e for e in entries if (e["phase"], e["op"]) == (phase, op)), None)
        if entry is None:
            entries.append({"phase": phase, "op": op, "count": count})
        else:
            entry["count"] += count


_CAPTURE = contextvars.ContextVar("audioparity_graph_capture", default=None)


@contextmanager
def capturing_graphs(capture) -> Iterator[None]:
    """Within the block, every runtime :func:`open_runtime` opens gets ``capture(writer)`` as
    its :attr:`Runtime.capture`: an object whose ``save(gf, inputs=..., outputs=..., kinds=...)``
    each graph calls once, at its first compute, and whose ``phase()`` names the dump stage
    running, under which a :class:`~audioparity.ggml.GraphCache` then keeps its graphs
    (:class:`audioparity.ggml.graphs.GraphCapture`, for a drill-down). The runtime itself
    imports none of it, so a dump's code inputs stay the runtime's."""
    token = _CAPTURE.set(capture)
    try:
        yield
    finally:
        _CAPTURE.reset(token)


def _free_runtime(sched, handles) -> None:
    ggml.ggml_backend_sched_free(sched)
    for handle in handles:
        ggml.ggml_backend_free(handle)
