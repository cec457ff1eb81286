"""A computed ggml graph saved to a folder, rebuilt from it on any backend, and run node by node
against another backend (the drill-down of a cell that one backend computes differently).

A saved graph is a folder (:func:`save_graph`, written by :class:`GraphCapture` at a graph's
first compute):

- ``graph.json``: the ggml build, the dump stage that was running (``phase``), the outputs by
  name, and every tensor the graph reaches in an order where each comes after what it reads:
  name, type, ``ne``/``nb``, op, ``op_params``, flags, sources and view source (indices),
  ``view_offs``, and for a leaf its kind (``input``, ``weight``, ``state``);
- ``inputs/<name>.npy``: the graph inputs as they were set (numpy order, their own dtype);
- ``leafs.gguf``: every other leaf (weights, a KV cache's state) in its stored ggml type, the
  bytes ggml held, read with the ``gguf`` package.

:func:`load_graph` rebuilds it in one buffer of a backend, every tensor allocated (nothing
reused), so each node's value stays readable after the compute. :func:`drill_down` runs a
target backend's graph node by node against the baseline backend's (ggml's
``ggml_backend_compare_graph_backend`` scheme): each node gets the baseline's values of its
sources, so its NMSE is its own error (what ggml's ``test-backend-ops`` measures per op), not
what the nodes before it accumulated.
"""

from __future__ import annotations

import ctypes
import difflib
import json
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.compare import metrics
from audioparity.contract.errors import AudioparityError
from audioparity.ggml.backends import build_info
from audioparity.ggml.bindings import address, ggml, tensor_bytes, tensor_values

#: The folder of a dump that holds its saved graphs, one ``<k>/`` each in compute order.
GRAPHS = "graphs"
GRAPH = "graph.json"
INPUTS = "inputs"
LEAFS = "leafs.gguf"

#: Ops that only re-describe their source's memory (no compute; ggml_is_view_op).
VIEW_OPS = ("RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE")
#: The NMSE above which ggml's own backend tests fail an op computed on two backends from the
#: same inputs (tests/test-backend-ops.cpp, ``test_generic_op::max_nmse_err``; flash
#: attention's grows with the KV length there, ``5e-4 * max(1, kv / 20000)``).
OP_NMSE = {"MUL_MAT": 5e-4, "MUL_MAT_ID": 5e-4, "OUT_PROD": 5e-4, "CONV_TRANSPOSE_2D": 5e-4,
           "IM2COL": 5e-4, "CONV_2D": 5e-4, "CONV_3D": 5e-4, "SET_ROWS": 5e-4, "CPY": 5e-4,
           "SOFT_MAX": 1e-6, "FLASH_ATTN_EXT": 5e-4, "RWKV_WKV7": 5e-3}
#: ggml's default for every other op.
DEFAULT_OP_NMSE = 1e-7
#: A node computed in float32 on both sides from the same inputs differs by rounding only
#: (summation order, a libm's last bit); above this NMSE something computed in lower precision.
FLOAT32_NMSE = 1e-10


def op_threshold(op: str, kv_length: int = 0) -> float:
    """ggml's NMSE tolerance of ``op`` between two backends (:data:`OP_NMSE`)."""
    if op == "FLASH_ATTN_EXT":
        return OP_NMSE[op] * max(1.0, kv_length / 20000.0)
    return OP_NMSE.get(op, DEFAULT_OP_NMSE)


def _op_name(op: int) -> str:
    return ggml.ggml_op_name(op).decode()


def _type_name(type_: int) -> str:
    return ggml.ggml_type_name(type_).decode()


def _numpy_shape(ne: Sequence[int]) -> list[int]:
    """``ne`` as a numpy shape, trailing size-1 axes of ``ne`` dropped (at least one axis)."""
    dims = len(ne)
    while dims > 1 and ne[dims - 1] == 1:
        dims -= 1
    return [int(n) for n in reversed(ne[:dims])]


def _reached(gf) -> list:
    """Every tensor graph ``gf`` reads or computes, each after its sources and view source."""
    order, entered, done = [], set(), set()
    for i in range(ggml.ggml_graph_n_nodes(gf)):
        stack = [ggml.ggml_graph_node(gf, i)]
        while stack:  # depth first; a tensor is listed when everything it reads is
            tensor = stack[-1]
            here = address(tensor)
            if here in done:
                stack.pop()
            elif here in entered:
                stack.pop()
                done.add(here)
                order.append(tensor)
            else:
                entered.add(here)
                t = tensor.contents
                stack.extend(parent for parent in (t.view_src, *t.src)
                             if parent and address(parent) not in done)
    return order


def save_graph(gf, folder: Path, *, inputs: dict[str, tuple[Any, np.ndarray]],
               outputs: dict[str, Any], kinds: Callable[[Any], str], phase: str | None
               ) -> None:
    """Write graph ``gf`` to ``folder`` (module docstring): as built, before its first
    compute, its weights and state holding their values, with the ggml build of this process
    (:func:`audioparity.ggml.build_info`: the one that built the graph), which
    :class:`LoadedGraph` checks against its own.

    Args:
        gf: the ``ggml_cgraph``.
        folder: the folder to write, created with its parents.
        inputs: name -> (tensor, the array set into it).
        outputs: name -> tensor of each named output.
        kinds: the kind of a leaf that is not an input: ``weight`` or ``state``.
        phase: the dump stage that computes it (``writer.running``), or None.

    Raises:
        FileExistsError: ``folder`` exists.
    """
    import gguf

    folder.mkdir(parents=True)
    (folder / INPUTS).mkdir()
    tensors = _reached(gf)
    index = {address(t): i for i, t in enumerate(tensors)}
    node_set = {address(ggml.ggml_graph_node(gf, i)) for i in range(ggml.ggml_graph_n_nodes(gf))}
    input_names = {address(tensor): name for name, (tensor, _) in inputs.items()}
    writer = gguf.GGUFWriter(str(folder / LEAFS), arch="audioparity-graph")
    records = []
    for i, tensor in enumerate(tensors):
        t = tensor.contents
        record = {
            "index": i, "name": ggml.ggml_get_name(tensor).decode(), "type": int(t.type),
            "type_name": _type_name(t.type), "ne": [int(n) for n in t.ne],
            "nb": [int(n) for n in t.nb], "op": int(t.op), "op_name": _op_name(t.op),
            "op_params": [int(p) for p in t.op_params], "flags": int(t.flags),
            "src": [index[address(s)] if s else None for s in t.src],
            "view_src": index[address(t.view_src)] if t.view_src else None,
            "view_offs": int(t.view_offs),
        }
        here = address(tensor)
        if here not in node_set:
            if here in input_names:
                record["kind"] = "input"
                record["file"] = f"{INPUTS}/{input_names[here]}.npy"
                np.save(folder / record["file"], inputs[input_names[here]][1])
            else:
                record["kind"] = kinds(tensor)
                record["key"] = f"{i}:{record['name']}"[: ggml.GGML_MAX_NAME - 1]
                raw = tensor_bytes(tensor)
                writer.add_tensor(record["key"], raw.reshape(_byte_shape(t)),
                                  raw_dtype=gguf.GGMLQuantizationType(int(t.type)))
        records.append(record)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    description = {
        "ggml_build": build_info(), "phase": phase,
        "outputs": {name: index[address(tensor)] for name, tensor in outputs.items()},
        "nodes": [index[address(ggml.ggml_graph_node(gf, i))]
                  for i in range(ggml.ggml_graph_n_nodes(gf))],
        "tensors": records,
    }
    (folder / GRAPH).write_text(json.dumps(description, indent=1) + "\n")


def _byte_shape(t) -> list[int]:
    """A contiguous tensor's bytes as gguf takes a raw buffer: ``ne`` reversed, the last axis
    in bytes (a row of ``ne[0]`` values in the tensor's type)."""
    return [int(t.ne[3]), int(t.ne[2]), int(t.ne[1]), int(ggml.ggml_row_size(t.type, t.ne[0]))]


@dataclass
class GraphCapture:
    """What a runtime hands each graph to at its first compute
    (:func:`audioparity.ggml.capturing_graphs`): :func:`save_graph` into ``folder/<k>/``, ``k``
    counting from 0 in compute order, with the dump stage running then (``phase()``)."""

    folder: Path
    phase: Callable[[], str | None]
    count: int = 0

    def save(self, gf, *, inputs: dict, outputs: dict, kinds: Callable[[Any], str]) -> None:
        save_graph(gf, self.folder / str(self.count), inputs=inputs, outputs=outputs,
                   kinds=kinds, phase=self.phase())
        self.count += 1

    @classmethod
    def of_dump(cls, writer) -> GraphCapture:
        """Into the ``graphs/`` folder of the dump ``writer`` writes, phases its ``running``."""
        writer.note(f"{GRAPHS}/: every ggml graph as first computed (audioparity.ggml.graphs)")
        return cls(Path(writer.partial) / GRAPHS, lambda: writer.running)


def _read_description(folder: Path) -> dict:
    path = Path(folder) / GRAPH
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise AudioparityError(f"{path}: unreadable saved graph ({err})") from err


class LoadedGraph:
    """A saved graph rebuilt on one backend, every tensor in one buffer of its own.

    Args:
        folder: a folder written by :func:`save_graph`.
        backend: a ``ggml_backend_t`` (the graph is allocated on it and computed there).

    Raises:
        AudioparityError: an unreadable folder, a graph saved by another ggml version (its op
            and type numbers may differ), or a leaf whose bytes are missing or misshapen.
    """

    def __init__(self, folder: str | os.PathLike, backend) -> None:
        self.folder = Path(folder)
        self.description = description = _read_description(self.folder)
        saved, here = description["ggml_build"].get("ggml"), build_info()["ggml"]
        if saved != here:
            raise AudioparityError(f"{self.folder}: saved by ggml {saved}; this is ggml {here}, "
                                   "whose op numbers may differ")
        records = description["tensors"]
        self.backend = backend
        params = ggml.ggml_init_params(
            mem_size=ggml.ggml_tensor_overhead() * (len(records) + 1)
            + ggml.ggml_graph_overhead_custom(max(len(description["nodes"]), 1), False),
            mem_buffer=None, no_alloc=True)
        self.ctx = ggml.ggml_init(params)
        inputs = {record["index"]: np.load(self.folder / record["file"]) for record in records
                  if record.get("kind") == "input"}
        #: View nodes of an input, rebuilt as inputs of their own: the scheduler keeps a graph
        #: input on the CPU and hands an accelerator a copy of each view it reads, of the same
        #: strides, at an offset of its own (a backend may refuse a view at an unaligned
        #: offset: ggml-vulkan's GET_ROWS aborts).
        self.input_views = {record["index"]: _view_values(record, inputs[record["view_src"]])
                            for record in records
                            if record["op_name"] in VIEW_OPS and record["view_src"] in inputs}
        self.tensors = []
        for record in records:
            self._add_tensor(record)
        self.buffer = ggml.ggml_backend_alloc_ctx_tensors(self.ctx, backend)
        if not self.buffer:
            raise AudioparityError(f"{self.folder}: could not allocate the graph's tensors")
        self._finalizer = weakref.finalize(self, _free, self.ctx, self.buffer)
        self._set_leafs(records, inputs)
        self.nodes = [self.tensors[i] for i in description["nodes"]]
        self.gf = ggml.ggml_new_graph_custom(self.ctx, max(len(self.nodes), 1), False)
        #: Node position -> its index in :attr:`gf` (the input views are not computed).
        self.computed: dict[int, int] = {}
        for position, (index, node) in enumerate(zip(description["nodes"], self.nodes,
                                                     strict=True)):
            if index not in self.input_views:
                self.computed[position] = len(self.computed)
                ggml.ggml_graph_add_node(self.gf, node)

    def _add_tensor(self, record: dict) -> None:
        """The tensor of one saved record appended to :attr:`tensors`, in :attr:`ctx`, then
        wired to its sources (an input view as an input of its own)."""
        ne = (ctypes.c_int64 * 4)(*record["ne"])
        tensor = ggml.ggml_new_tensor(self.ctx, record["type"], 4, ne)
        ggml.ggml_set_name(tensor, record["name"].encode())
        self.tensors.append(tensor)
        t = tensor.contents
        for axis in range(4):
            t.nb[axis] = record["nb"][axis]
        if record["index"] in self.input_views:
            t.flags = ggml.GGML_TENSOR_FLAG_INPUT
            return
        t.op = record["op"]
        for k, value in enumerate(record["op_params"]):
            t.op_params[k] = value
        t.flags = record["flags"]
        for k, source in enumerate(record["src"]):
            if source is not None:
                t.src[k] = self.tensors[source]
        if record["view_src"] is not None:
            t.view_src = self.tensors[record["view_src"]]
            t.view_offs = record["view_offs"]

    def _set_leafs(self, records: list[dict], inputs: dict[int, np.ndarray]) -> None:
        """Give every leaf its saved bytes: the inputs and input views their arrays, the other
        leafs (weights, state) theirs from ``leafs.gguf``."""
        import gguf

        reader = gguf.GGUFReader(str(self.folder / LEAFS))
        stored = {tensor.name: tensor for tensor in reader.tensors}
        for record, tensor in zip(records, self.tensors, strict=True):
            if record.get("kind") == "input":
                data = np.ascontiguousarray(inputs[record["index"]])
            elif record["index"] in self.input_views:
                data = self.input_views[record["index"]]
            elif "key" in record:
                if record["key"] not in stored:
                    raise AudioparityError(f"{self.folder / LEAFS}: no tensor {record['key']!r}")
                data = np.ascontiguousarray(stored[record["key"]].data).view(np.uint8)
            else:
                continue
            if data.nbytes != ggml.ggml_nbytes(tensor):
                raise AudioparityError(f"{self.folder}: leaf {record['name']!r} holds "
                                       f"{data.nbytes} bytes; expected "
                                       f"{ggml.ggml_nbytes(tensor)}")
            ggml.ggml_backend_tensor_set(tensor, data.ctypes.data_as(ctypes.c_void_p), 0,
                                         data.nbytes)

    def compute(self, position: int | None = None) -> None:
        """Compute every node (``position`` None), or only node ``position`` of the graph.

        Raises:
            AudioparityError: the backend reports a failed compute.
        """
        if position is None:
            status = ggml.ggml_backend_graph_compute(self.backend, self.gf)
        else:
            index = self.computed[position]
            view = ggml.ggml_graph_view(self.gf, index, index + 1)
            status = ggml.ggml_backend_graph_compute(self.backend, ctypes.byref(view))
        if status != ggml.GGML_STATUS_SUCCESS:
            raise AudioparityError(f"{self.folder}: graph compute failed (status {status})")

    def read(self, tensor) -> np.ndarray:
        """A contiguous tensor's values, flat, as float64 (:func:`tensor_values`)."""
        return tensor_values(tensor).astype(np.float64)

    def write(self, tensor, source) -> None:
        """Give ``tensor`` the bytes of ``source`` (a tensor of another loaded graph)."""
        raw = tensor_bytes(source)
        ggml.ggml_backend_tensor_set(tensor, raw.ctypes.data_as(ctypes.c_void_p), 0, raw.nbytes)

    def close(self) -> None:
        self._finalizer()


def _view_values(record: dict, root: np.ndarray) -> np.ndarray:
    """The bytes a view node of an input spans (what the scheduler's copy of it holds): from
    ``view_offs`` into the input (ggml points a view at the root tensor, offsets summed) for
    ``ggml_nbytes`` of its ``ne`` and ``nb``."""
    raw = np.ascontiguousarray(root).view(np.uint8).reshape(-1)
    span = root.dtype.itemsize + sum((n - 1) * b for n, b in zip(record["ne"], record["nb"],
                                                                strict=True))
    start = record["view_offs"]
    if start + span > raw.size:
        raise AudioparityError(f"view {record['name']!r} spans bytes {start}..{start + span} "
                               f"of an input of {raw.size}")
    return raw[start:start + span].copy()


def _free(ctx, buffer) -> None:
    ggml.ggml_backend_buffer_free(buffer)
    ggml.ggml_free(ctx)


def _signature(record: dict) -> tuple:
    """What must agree for two nodes to be the same step of two graphs."""
    return (record["op"], tuple(record["op_params"]), record["type"], tuple(record["ne"]))


def _feeds(description: dict) -> dict[int, str]:
    """Tensor index -> the name of the first output (in node order) that depends on it."""
    records = description["tensors"]
    position = {index: k for k, index in enumerate(description["nodes"])}
    feeds: dict[int, str] = {}
    for name, out in sorted(description["outputs"].items(), key=lambda kv: position.get(kv[1], 0)):
        stack = [out]
        while stack:
            index = stack.pop()
            if index in feeds:
                continue
            feeds[index] = name
            record = records[index]
            stack.extend(s for s in (*record["src"], record["view_src"]) if s is not None)
    return feeds


def _nmse(target: np.ndarray, baseline: np.ndarray) -> float:
    """:func:`audioparity.compare.metrics.nmse` of the target against the baseline, and 0 for
    two tensors equal to the bit, NaN where both hold it included (a NaN both backends compute
    is not where they part)."""
    if np.array_equal(target, baseline, equal_nan=True):
        return 0.0
    return metrics.nmse(target, baseline)


def drill_down(baseline_folder: Path, target_folder: Path, baseline_backend, target_backend,
               target_name: str) -> dict:
    """Run the target's saved graph node by node on ``target_backend`` against the baseline's
    saved graph on ``baseline_backend`` (module docstring); the result as a JSON object.

    The two graphs are aligned node by node (difflib over op, op params, type and shape; a port
    that builds another graph on one backend leaves nodes that align with nothing). The
    baseline is computed whole; then each target node, after its aligned sources took the
    baseline's values: its NMSE against its aligned baseline node is its own. A node the
    target backend does not support (the scheduler runs it on the CPU) takes the baseline's
    values and is not measured.

    Returns:
        ``{phase, outputs, nodes: [...], first_bad, first_not_float32, worst, structure}``: per
        target node its position, name, op, type, numpy shape, source types, the output it
        first feeds, ``nmse``, ggml's ``threshold`` for the op and a ``verdict`` (``ok``,
        ``above threshold``, ``only in <target>``, ``view``, ``not supported``); the first node
        above ggml's threshold (or found only in the target graph), the first above
        :data:`FLOAT32_NMSE`, and the one of largest NMSE.
    """
    baseline = LoadedGraph(baseline_folder, baseline_backend)
    target = LoadedGraph(target_folder, target_backend)
    try:
        return _drill(baseline, target, target_name)
    finally:
        target.close()
        baseline.close()


def _drill(baseline: LoadedGraph, target: LoadedGraph, target_name: str) -> dict:
    base_records = [baseline.description["tensors"][i] for i in baseline.description["nodes"]]
    records = [target.description["tensors"][i] for i in target.description["nodes"]]
    matcher = difflib.SequenceMatcher(None, [_signature(r) for r in base_records],
                                      [_signature(r) for r in records], autojunk=False)
    aligned = {j: i for a, b, size in matcher.get_matching_blocks()
               for i, j in zip(range(a, a + size), range(b, b + size), strict=True)}
    leafs = _sync_leafs(baseline, target)
    baseline.compute()
    feeds = _feeds(target.description)
    nodes = []
    for j, (record, node) in enumerate(zip(records, target.nodes, strict=True)):
        entry = {
            "position": j, "name": record["name"], "op": record["op_name"],
            "type": record["type_name"], "shape": _numpy_shape(record["ne"]),
            "source_types": [target.description["tensors"][s]["type_name"]
                             for s in record["src"] if s is not None],
            "feeds": feeds.get(target.description["nodes"][j]),
        }
        i = aligned.get(j)
        counterpart = baseline.nodes[i] if i is not None else None
        if record["op_name"] in VIEW_OPS:
            entry["verdict"] = "view"
            if target.description["nodes"][j] in target.input_views and counterpart is not None:
                target.write(node, counterpart)  # a view of an input: the baseline's, as inputs
        elif not ggml.ggml_backend_supports_op(target.backend, node):
            entry["verdict"] = "not supported"
            if counterpart is not None:
                target.write(node, counterpart)
        else:
            target.compute(j)
            if counterpart is None:
                entry["verdict"] = f"only in {target_name}"
            else:
                kv = record["ne"][1] if record["op_name"] == "FLASH_ATTN_EXT" else 0
                threshold = op_threshold(record["op_name"], kv)
                values, base_values = target.read(node), baseline.read(counterpart)
                nmse = _nmse(values, base_values)
                entry.update(nmse=nmse, threshold=threshold, verdict=(
                    "ok" if nmse <= threshold else
                    "not finite in the baseline" if np.isfinite(values).all() else
                    "above threshold"))
                target.write(node, counterpart)
        nodes.append(entry)
    measured = [n for n in nodes if "nmse" in n]
    first_bad = next((n for n in nodes if n["verdict"] in (
        "above threshold", "not finite in the baseline", f"only in {target_name}")), None)
    first_f32 = next((n for n in measured if not n["nmse"] <= FLOAT32_NMSE), None)
    worst = max(measured, key=lambda n: (np.nan_to_num(n["nmse"], nan=np.inf)), default=None)
    structure = ("same" if len(aligned) == len(records) == len(base_records) else
                 f"differs: {len(records) - len(aligned)} of {len(records)} {target_name} nodes "
                 f"and {len(base_records) - len(aligned)} of {len(base_records)} baseline nodes "
                 "align with nothing")
    differing = [leaf for leaf in leafs if leaf["kind"] == "weight"]
    if differing and (first_bad is None or first_bad["verdict"] == "ok"):
        first_bad = {**differing[0], "verdict": "leaf differs"}
    return {"phase": target.description["phase"], "outputs": sorted(target.description["outputs"]),
            "structure": structure, "first_bad": first_bad, "first_not_float32": first_f32,
            "worst": worst, "leafs": leafs, "nodes": nodes}


def _sync_leafs(baseline: LoadedGraph, target: LoadedGraph) -> list[dict]:
    """Give each target leaf the baseline's leaf of the same name and kind (inputs carry what
    the cell computed before the graph, which the two cells computed differently; weights and
    state should be the same bytes), and list every leaf whose values differed: name, kind,
    type, NMSE."""
    def leafs(graph: LoadedGraph) -> dict[tuple[str, str], int]:
        found: dict[tuple[str, str], int] = {}
        for i, record in enumerate(graph.description["tensors"]):
            if "kind" in record:
                key = (record["name"], record["kind"])
                found[key] = -1 if key in found else i  # -1: ambiguous, not aligned
        return found

    base = leafs(baseline)
    differing = []
    for key, i in leafs(target).items():
        j = base.get(key, -1)
        if i < 0 or j < 0:
            continue
        record, base_record = target.description["tensors"][i], baseline.description["tensors"][j]
        if (record["type"], record["ne"]) != (base_record["type"], base_record["ne"]):
            differing.append({"name": key[0], "kind": key[1], "type": record["type_name"],
                              "nmse": None, "why": f"{base_record['type_name']} "
                              f"{base_record['ne']} in the baseline"})
            continue
        nmse = _nmse(target.read(target.tensors[i]), baseline.read(baseline.tensors[j]))
        if nmse != 0.0:
            differing.append({"name": key[0], "kind": key[1], "type": record["type_name"],
                              "nmse": nmse})
        target.write(target.tensors[i], baseline.tensors[j])
    return differing


def drill_pairs(pairs: Sequence[tuple[int, Path, Path]], done: Path, baseline: str, target: str,
                device: int = 0, threads: int = 1) -> None:
    """:func:`drill_down` of each ``(graph number, baseline folder, target folder)`` on the
    ``baseline`` and ``target`` backends, one JSON line per graph appended to ``done`` as it
    finishes (so the caller knows where a process that ggml aborted stopped), up to the first
    graph with a bad op: the graphs after it read what it computed, so their ops can only
    repeat its difference, and the first bad op is the drill-down's answer."""
    from audioparity.ggml.runtime import Runtime

    with Runtime(baseline, device=device, threads=threads) as base, Runtime(
            target, device=device, threads=threads) as other:
        for number, base_folder, target_folder in pairs:
            result = drill_down(Path(base_folder), Path(target_folder), base.backend,
                                other.backend, target)
            with open(done, "a") as stream:
                stream.write(json.dumps(_strict({"graph": number, **result}),
                                        allow_nan=False) + "\n")
                stream.flush()
                os.fsync(stream.fileno())
            if result.get("first_bad"):
                break


def _strict(value):
    """``value`` as strict JSON: non-finite floats as the strings ``nan``, ``inf``, ``-inf``."""
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_strict(item) for item in value]
    if isinstance(value, float) and not np.isfinite(value):
        return repr(value)
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m audioparity.ggml.graphs PAIRS.json DONE.jsonl --baseline B --target T``:
    :func:`drill_pairs` of the ``[number, baseline, target]`` entries of PAIRS.json (the child
    process of :mod:`audioparity.compare.drilldown`)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m audioparity.ggml.graphs")
    parser.add_argument("pairs", type=Path)
    parser.add_argument("done", type=Path)
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    drill_pairs(json.loads(args.pairs.read_text()), args.done, args.baseline, args.target,
                args.device, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
