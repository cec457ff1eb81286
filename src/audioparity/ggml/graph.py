"""One compute graph on a :class:`~audioparity.ggml.runtime.Runtime`.

A :class:`Graph` is a per-graph ``no_alloc`` context: inputs are numpy arrays (copied in with
``ggml_backend_tensor_set`` after allocation), any number of named outputs (taps) are marked
``ggml_set_output`` and read back as float32 numpy arrays, and side-effect nodes (writes into a
:class:`~audioparity.ggml.tensors.State`) join with :meth:`Graph.expand`. Nodes enter the graph
in the order of the :meth:`Graph.output` / :meth:`Graph.expand` calls, which is the order ggml
computes them in. A graph can be computed again with new input values of the same shapes
(:meth:`Graph.set`); several graphs may stay open and be computed in turn: the scheduler
re-allocates on each switch, after the graph is put back as it was built (the scheduler rewires
a node's source to a copy on another backend, and frees those copies at its next allocation; a
graph recomputed after another one ran would point at freed tensors). A :class:`GraphCache`
keeps the graphs of a model object by key and input shapes, so that one built graph serves every
call of the same shape.
"""

from __future__ import annotations

import ctypes
import itertools
import time
import weakref
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.memory import MEMORY_LIMIT
from audioparity.ggml.backends import free_bytes
from audioparity.ggml.bindings import _ne, _numpy_shape, _ptr, address, ggml

if TYPE_CHECKING:
    from audioparity.ggml.runtime import Runtime

#: Ops that compute nothing (ggml_op_is_empty): no backend runs them.
_EMPTY_OPS = (ggml.GGML_OP_NONE, ggml.GGML_OP_RESHAPE, ggml.GGML_OP_VIEW, ggml.GGML_OP_PERMUTE,
              ggml.GGML_OP_TRANSPOSE)

#: The most graphs one :class:`GraphCache` keeps; a call past them builds a graph for itself.
GRAPH_CACHE_LIMIT = 256

_SERIALS = itertools.count()

_INPUT_TYPES = {
    np.dtype(np.float32): ggml.GGML_TYPE_F32,
    np.dtype(np.float16): ggml.GGML_TYPE_F16,
    np.dtype(np.int32): ggml.GGML_TYPE_I32,
}


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
        self._placement: _Placement | None = None  # what the scheduler writes, as built
        self._saved = False
        self._checked = False  # compute buffers checked against the memory free
        self._unsupported: dict[str, int] | None = None  # ops the backend leaves to the CPU
        #: Tells this graph from every other one of the process (an ``id`` may be reused).
        self.serial = next(_SERIALS)
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
        if rt.on_cpu is not None:
            if self._unsupported is None:  # as built: the scheduler rewires sources
                self._unsupported = self.unsupported_ops()
            if self._unsupported:
                rt.on_cpu(self, self._unsupported)
        if rt._active is not self:
            ggml.ggml_backend_sched_reset(rt._sched)
            self._as_built()
            held = None if self._checked else [
                (ggml.ggml_backend_sched_get_buffer_size(rt._sched, h), free_bytes(h))
                for h in rt._backends]
            if not ggml.ggml_backend_sched_alloc_graph(rt._sched, self._gf):
                raise AudioparityError(f"could not allocate a graph of {self.n_nodes} nodes "
                                       f"on {rt.backend_name}")
            if held is not None:
                self._check_memory(held)
            rt._active = self
        for name, (tensor, array) in self._inputs.items():
            if not tensor.contents.buffer:  # the scheduler allocates only what the graph holds
                raise AudioparityError(
                    f"graph input {name!r} ({array.dtype} {list(array.shape)}) is not used by "
                    f"any output or expanded node; use it or do not declare it"
                )
            ggml.ggml_backend_tensor_set(tensor, _ptr(array), 0, array.nbytes)
        started = time.perf_counter()
        status = ggml.ggml_backend_sched_graph_compute(rt._sched, self._gf)
        if rt.on_computed is not None:
            rt.on_computed(time.perf_counter() - started)
        if status != ggml.GGML_STATUS_SUCCESS:
            raise AudioparityError(f"graph compute on {rt.backend_name} failed (status {status})")
        results = {}
        for name, (tensor, ndim) in self._outputs.items():
            out = np.empty(_numpy_shape(tensor, ndim), dtype=np.float32)
            ggml.ggml_backend_tensor_get(tensor, _ptr(out), 0, out.nbytes)
            results[name] = out
        return results

    def unsupported_ops(self) -> dict[str, int]:
        """The ops of this graph's nodes its runtime's backend does not support
        (``ggml_backend_supports_op``), which the scheduler runs on the CPU: op name -> nodes;
        empty on the CPU backend. Nodes that compute nothing (views) are not asked about."""
        rt = self._runtime
        if rt.backend_name == "cpu":
            return {}
        found: dict[str, int] = {}
        for i in range(self.n_nodes):
            node = ggml.ggml_graph_node(self._gf, i)
            if node.contents.op not in _EMPTY_OPS and not ggml.ggml_backend_supports_op(
                    rt.backend, node):
                name = ggml.ggml_op_name(node.contents.op).decode()
                found[name] = found.get(name, 0) + 1
        return found

    def _check_memory(self, held: list[tuple[int, int | None]]) -> None:
        """Refuse the graph, before its first compute touches a page, when a backend's compute
        buffer (just allocated: address space on the host) exceeds what that backend had before
        the allocation: its compute buffer then plus its free memory (``held``, per backend of
        the runtime: the buffer's bytes, and the host's ``MemAvailable`` or
        :data:`MEMORY_LIMIT`, a device's free memory, None: unknown). The scheduler keeps its
        buffers between graphs and replaces one only to grow it, so a graph that fits the
        buffers of an earlier one needs no memory more.

        The buffers are sized by ``ggml_backend_sched_alloc_graph`` itself, not by a
        ``ggml_backend_sched_reserve`` first: reserving and then allocating the same graph
        corrupted the heap now and then on Vulkan (double free, segfault: 4 runs in 40 of the
        Whisper drill-down on lavapipe, none in 40 without it).
        """
        rt = self._runtime
        for handle, (before, free) in zip(rt._backends, held, strict=True):
            need = ggml.ggml_backend_sched_get_buffer_size(rt._sched, handle)
            if free is not None and need > before + free:
                where = ggml.ggml_backend_name(handle).decode()
                raise AudioparityError(
                    f"a graph of {self.n_nodes} nodes needs {need / 2**20:.0f} MiB of compute "
                    f"buffers on {where}, more than the {(before + free) / 2**20:.0f} MiB free "
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

        At its first allocation the fields of its tensors that the scheduler and the allocator
        write are recorded as built (:class:`_Placement`). At a later one (another graph ran in
        between) they get those values back: each node its sources, since the scheduler had
        rewired some to its copies on the other backend, which it has freed since; and each
        tensor its ``buffer`` and ``data`` (none, or a view's of the weights or state), since
        the allocator takes a tensor with ``data`` as allocated and the scheduler a tensor with
        a ``buffer`` as living there, and both are stale now. Both are one vectorised write
        into the context's memory, however many nodes the graph has.
        """
        if self._placement is None:
            self._placement = _Placement.of(self)
        else:
            self._placement.restore()

    def close(self) -> None:
        """Free the graph context (the scheduler's allocation is dropped with it)."""
        if self._runtime._active is self:
            self._runtime._active = None
        self._finalizer()

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_WORD = ctypes.sizeof(ctypes.c_uint64)


class _Placement:
    """The fields of a graph's tensor structs that the scheduler and the allocator write, as
    64-bit words of its context's memory (every tensor struct of the graph lives there), with
    their values as built, so that :meth:`restore` writes them back in one vectorised step:
    each node's ``src`` slots, and each node's and input's ``buffer`` and ``data`` (the
    graph's other leafs are the weights and state, which live elsewhere).

    Attributes:
        words: the context's memory, as 64-bit words (a view, not a copy).
        fields: the word index of every such field.
        built: their values as built.
    """

    SRC, BUFFER, DATA = (getattr(ggml.ggml_tensor, field).offset // _WORD
                         for field in ("src", "buffer", "data"))
    MAX_SRC = ggml.ggml_tensor.src.size // _WORD

    def __init__(self, words: np.ndarray, fields: np.ndarray) -> None:
        self.words, self.fields = words, fields
        self.built = words[fields].copy()

    @classmethod
    def of(cls, graph: Graph) -> _Placement:
        """The placement of ``graph`` as built (before its first allocation).

        Raises:
            AudioparityError: a node's struct is not in the graph's context (a node built on
                another context could not be put back).
        """
        base = address(ggml.ggml_get_mem_buffer(graph.ctx))
        words = np.ctypeslib.as_array((ctypes.c_uint64 * (
            ggml.ggml_get_mem_size(graph.ctx) // _WORD)).from_address(base))
        nodes = np.ctypeslib.as_array((ctypes.c_uint64 * graph.n_nodes).from_address(
            address(ggml.ggml_graph_nodes(graph._gf)))).astype(np.int64) - base
        inputs = np.array([address(tensor) for tensor, _ in graph._inputs.values()],
                          dtype=np.int64) - base
        tensors = np.concatenate([nodes, inputs])
        if tensors.size and (tensors.min() < 0 or tensors.max() >= words.nbytes):
            raise AudioparityError("a graph node was built on another ggml context")
        tensors //= _WORD
        sources = tensors[:len(nodes), None] + cls.SRC + np.arange(cls.MAX_SRC)
        return cls(words, np.concatenate([sources.ravel(), tensors + cls.BUFFER,
                                          tensors + cls.DATA]))

    def restore(self) -> None:
        """Every field as built."""
        self.words[self.fields] = self.built


class GraphCache:
    """The graphs of one model object (an encoder, a decoder with its caches), each built once
    per key and input shapes and computed again with new input values (:meth:`Graph.set`), as
    llama.cpp reuses a graph whose shapes did not change: the same graph on the same values
    computes the same bytes, and what is saved is the build in Python (a ctypes call per node)
    and its first placement.

    The key names what the graph's structure depends on besides its inputs' shapes and dtypes
    (a layer index, a KV-cache position); the build sees nothing else that changes, since the
    cache belongs to the object that holds the weights and state the graphs read. While the
    runtime captures graphs (:func:`~audioparity.ggml.runtime.capturing_graphs`) the key also
    holds the dump stage running (the capture's ``phase()``), so that each stage's graphs are
    saved under it, as a drill-down pairs them. Past :data:`GRAPH_CACHE_LIMIT` graphs a call
    builds its own and frees it.

    Args:
        runtime: the runtime the graphs compute on.
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._graphs: dict[tuple, Graph] = {}

    def compute(self, key: Hashable, inputs: Mapping[str, np.ndarray],
                build: Callable[[Graph, dict[str, Any]], None]) -> dict[str, np.ndarray]:
        """:meth:`Graph.compute` of the graph of ``key`` on ``inputs``.

        Args:
            key: what the graph's nodes depend on besides the inputs' shapes and dtypes.
            inputs: name -> array of every graph input (as :meth:`Graph.input` takes it).
            build: called once per key and shapes with the new graph and its input tensors by
                name; declares the outputs (:meth:`Graph.output`, :meth:`Graph.expand`).

        Returns:
            every output by name, as :meth:`Graph.compute` returns them.

        Raises:
            AudioparityError: as :meth:`Graph.input` and :meth:`Graph.compute`.
        """
        arrays = {name: np.ascontiguousarray(array) for name, array in inputs.items()}
        capture = self._runtime.capture
        full_key = (key, tuple((name, a.shape, a.dtype.str) for name, a in arrays.items()),
                    None if capture is None else capture.phase())
        graph = self._graphs.get(full_key)
        if graph is not None:
            for name, array in arrays.items():
                graph.set(name, array)
            return graph.compute()
        graph = self._runtime.graph()
        try:
            build(graph, {name: graph.input(name, array) for name, array in arrays.items()})
        except BaseException:
            graph.close()
            raise
        if len(self._graphs) >= GRAPH_CACHE_LIMIT:
            with graph:
                return graph.compute()
        self._graphs[full_key] = graph
        return graph.compute()

    def __len__(self) -> int:
        return len(self._graphs)

    def close(self) -> None:
        """Free every graph kept."""
        for graph in self._graphs.values():
            graph.close()
        self._graphs.clear()
