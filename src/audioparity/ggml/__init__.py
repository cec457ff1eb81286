"""The ggml runtime layer over ggml-python 0.0.45: the backends (:mod:`.backends`), a runtime
over one of them (:mod:`.runtime`), weights and state in backend buffers (:mod:`.tensors`), and
compute graphs (:mod:`.graph`); the ctypes plumbing lives once in :mod:`.bindings`. Model code
builds graphs with the ggml operators (``ggml.ggml_mul_mat(g.ctx, ...)``) on tensors these hand
out, and never touches ctypes, buffers or allocators. :mod:`.ops` holds the few operators whose
ggml form depends on a weight's type; :mod:`.graphs` saves graphs and compares them node by node.

Shapes are numpy-order everywhere: an array ``[T, D]`` is a ggml tensor of ``ne = [D, T]``.

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
"""

from audioparity.dumping.storage import storage_or_fallback, storage_supported
from audioparity.ggml.backends import BackendUnavailable, build_info, check_backend, doctor
from audioparity.ggml.bindings import STORAGE_TYPES, numpy_shape, tensor_name
from audioparity.ggml.graph import Graph, GraphCache
from audioparity.ggml.runtime import Runtime, capturing_graphs, open_runtime
from audioparity.ggml.tensors import MissingWeight, State, Weights

__all__ = [
    "STORAGE_TYPES",
    "BackendUnavailable",
    "Graph",
    "GraphCache",
    "MissingWeight",
    "Runtime",
    "State",
    "Weights",
    "build_info",
    "capturing_graphs",
    "check_backend",
    "doctor",
    "numpy_shape",
    "open_runtime",
    "storage_or_fallback",
    "storage_supported",
    "tensor_name",
]
