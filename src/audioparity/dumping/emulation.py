"""The quantization-aware reference: a torch model computing as a ggml port on the CPU backend
does with its weights stored in a weight type (:func:`emulating`, :func:`emulations`): each
matmul weight as ggml stores it (:func:`~.storage.stored`) and each matmul input rounded as the
CPU backend rounds it (:func:`~.storage.matmul_input`). Torch is imported once it runs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import (
    FLOAT_STORAGE_TYPES,
)
from audioparity.dumping.storage import (
    EMULATED_TYPES,
    VEC_DOT_TYPES,
    StoredWeights,
    block_hashes,
    dequantize,
    matmul_input,
    matrix_shape,
    min_term,
    quantize,
    storage_or_fallback,
)
from audioparity.dumping.weight_files import FileStorage, Recipe, rows_of

#: The NMSE past which a candidate's stored values are not a rounding of the checkpoint's: a
#: type's own rounding moves a weight by far less (q2_K by about 0.1), a transposed or permuted
#: layout by about 2.
_UNLIKE = 0.5

#: Rows of a weight rounded at a time by :func:`emulating`: the rounding's temporaries stay
#: small beside a 151936-row embedding (1.2 GB in float32 at the 1.7B shape).
_ROWS_AT_ONCE = 4096


@contextmanager
def emulating(model: Any, weight_type: str | Recipe | FileStorage, keep: Collection[str] = (),
              prefix: str = "") -> Iterator[StoredWeights]:
    """Within the block, the torch ``model`` computes as a ggml port on the CPU backend does with
    its matmul weights stored as ``weight_type`` (one of :data:`EMULATED_TYPES`, or a
    :class:`Recipe` giving each weight's), or with exactly the bytes a candidate's own file
    stores (a :class:`FileStorage`: the storage-matched reference); on leaving it, the model is
    float32 again (weights, hooks and forwards restored).

    The matmul weights are those of ``nn.Linear``, pointwise ``nn.Conv1d`` and ``nn.Conv2d``
    (kernel 1, one group; ggml runs them as matmuls over the channels), ``nn.Embedding`` (a
    lookup: rounded weights, the rows read as stored) and ``nn.LSTM`` (its input and recurrent
    matrices); each is stored as its type, or as its fallback where its rows are no multiple of
    the block size (:func:`storage_or_fallback`), and each matmul's input is rounded
    (:func:`matmul_input`) by a forward pre-hook, or for an LSTM by a step-by-step forward
    (torch's gate order ``i, f, g, o``). Other weights (norms, biases, conv kernels), and the
    modules named in ``keep`` (those a port keeps in float32), stay float32.
    A parameter shared by two modules (tied embeddings) is rounded once. A weight is named as
    the port names it: its parameter name less ``prefix``.

    With a :class:`FileStorage`, each matmul weight the file holds is its bytes, read by ggml's
    ``to_float``, in the file's type (no fallback is chosen: the file's is what the candidate
    computes with), and its input is rounded for that type; one the file lacks stays float32,
    noted. Any other parameter the file holds narrower than f32 (an f16 convolution kernel or
    bias) is its bytes too, and a convolution whose kernel the file holds as f16 has its input
    rounded to f16, as ggml's ``im2col`` in the kernel's type and the matmul after
    it compute (``ggml_conv_1d``, ``ggml_conv_2d``). The hashes it records are of ggml's own
    quantization of the checkpoint at each weight's type: what the candidate's bytes are
    measured against (``stored_weights``).

    Yields:
        What it stored (:class:`StoredWeights`): a note per weight stored as its fallback (the
        ggml dump's manifest notes them alike), each weight's type and block hashes.

    Raises:
        AudioparityError: ``weight_type`` is not emulated, a recipe override that names no
            matmul weight of the model, an LSTM with a projection, or a convolution kernel a
            file stores as a block type.
    """
    if isinstance(weight_type, FileStorage):
        recipe: Recipe | FileStorage = weight_type
    else:
        recipe = weight_type if isinstance(weight_type, Recipe) else Recipe.uniform(weight_type)
        if recipe.base not in EMULATED_TYPES:
            raise AudioparityError(f"no quantization-aware reference for weight type "
                                   f"{recipe.base!r}; emulated: {', '.join(EMULATED_TYPES)}")
    emulation = _Emulation(recipe, prefix)
    try:
        emulation.apply(model, keep)
        unused = (sorted(set(recipe.overrides) - set(emulation.stored.types))
                  if isinstance(recipe, Recipe) else [])
        if unused:
            raise AudioparityError(f"recipe {recipe.weight_type}: {unused[0]} is no matmul weight "
                                   f"of this model ({len(unused)} override(s) name none)")
        yield emulation.stored
    finally:
        emulation.restore()


def matmul_modules(model: Any, keep: Collection[str] = ()) -> Iterator[tuple[str, Any, str]]:
    """The modules of torch ``model`` whose weights a ggml port multiplies as matrices (but those
    named in ``keep``), as ``(name, module, kind)``: ``linear`` (``nn.Linear``), ``conv`` (a
    pointwise ``nn.Conv1d``/``nn.Conv2d``: kernel 1, one group), ``embedding`` (a lookup of
    stored rows) and ``lstm`` (its ``weight_ih_l*`` and ``weight_hh_l*``).

    Raises:
        AudioparityError: an LSTM with a projection (ggml ports have none to mirror).
    """
    import torch

    for name, module in model.named_modules():
        if name in keep:
            continue
        if isinstance(module, torch.nn.Linear):
            yield name, module, "linear"
        elif isinstance(module, torch.nn.Conv1d | torch.nn.Conv2d) and module.groups == 1 \
                and set(module.kernel_size) == {1}:
            yield name, module, "conv"
        elif isinstance(module, torch.nn.Embedding):
            yield name, module, "embedding"
        elif isinstance(module, torch.nn.LSTM):
            if module.proj_size:
                raise AudioparityError(f"{name}: an LSTM with proj_size={module.proj_size} "
                                       "is not emulated")
            yield name, module, "lstm"


class _Emulation:
    """What :func:`emulating` changed in a model, to restore it: the weights rounded (each
    parameter once, with its float32 copy), the input hooks, the LSTMs stepped."""

    def __init__(self, policy: Recipe | FileStorage, prefix: str = "") -> None:
        self.policy, self.prefix = policy, prefix
        self.stored = StoredWeights()
        self.notes = self.stored.notes
        self.originals: dict[int, tuple[Any, Any]] = {}
        self.types: dict[int, str | None] = {}
        self.hooks: list[Any] = []
        self.lstms: list[Any] = []

    def store(self, name: str, param, shape: tuple[int, ...] | None = None) -> str | None:
        """Round parameter ``name`` in place as its storage holds it (viewed as the matrix
        ``shape``; without one, a matmul weight's first two axes: a pointwise kernel ``[out,
        in, 1(, 1)]`` is a matrix); its storage type, None where it stays float32 (a file that
        lacks it)."""
        if id(param) in self.types:  # a parameter of two modules (tied): stored once
            return self.types[id(param)]
        name = name.removeprefix(self.prefix)
        if shape is None:
            shape = tuple(param.shape[:2])
            self.stored.matmul[name] = list(shape)
        if isinstance(self.policy, FileStorage):  # the file's type: what the port computes with
            held = self.policy.held(name, tuple(param.shape), self.notes)
            storage = held.type if held is not None else None
        else:
            held = None
            storage = storage_or_fallback(name, self.policy.storage(name), shape, self.notes)
        self.types[id(param)] = storage
        if storage is None:
            return None
        self.originals[id(param)] = (param, param.detach().clone())
        matrix = param.detach().numpy().reshape(shape)  # the parameter's own memory
        hashes, moved, total = [], 0.0, 0.0
        for first in range(0, shape[0], _ROWS_AT_ONCE):  # rows are stored independently
            rows = matrix[first:first + _ROWS_AT_ONCE]
            quantized = quantize(rows, storage)  # ggml's quantization of the checkpoint
            raw = rows_of(held, first, len(rows)) if held is not None else quantized
            hashes.append(block_hashes(quantized, storage, rows.shape))
            with np.errstate(over="ignore", invalid="ignore"):
                values = dequantize(raw, storage, rows.shape)
                if held is not None:
                    moved += float(np.sum((values.astype(np.float64) - rows) ** 2))
                    total += float(np.sum(rows.astype(np.float64) ** 2))
            rows[...] = values
        if held is not None and not moved <= _UNLIKE * max(total, 1e-30):
            self.notes.append(f"{name}: the candidate's values are not the checkpoint's "
                              f"(NMSE {moved / max(total, 1e-30):.3g} as {storage}): another "
                              "layout than its adapter maps, or its quantizer's fault")
        self.stored.types[name] = storage
        self.stored.hashes[name] = np.concatenate(hashes)
        return storage

    def round_input(self, module, storage: str, channels_last: bool) -> None:
        """Round ``module``'s input for a weight stored as ``storage`` (a pre-hook), and for a
        weight with block minimums add the dot product's :func:`min_term` to its output (a
        forward hook on the input the pre-hook saw)."""
        if storage == "f32":
            return
        inputs = []

        def pre_hook(_, args):
            if VEC_DOT_TYPES[storage] == "q8_1":
                inputs[:] = [args[0]]
            return (_rounded(args[0], storage, channels_last), *args[1:])

        self.hooks.append(module.register_forward_pre_hook(pre_hook))
        if VEC_DOT_TYPES[storage] == "q8_1":
            self.hooks.append(module.register_forward_hook(
                lambda m, _, out: out + _min_term(inputs.pop(), m.weight, storage,
                                                  channels_last)))

    def apply(self, model: Any, keep: Collection[str]) -> None:
        """Every matmul weight of ``model`` (but the modules of ``keep``) stored, and its
        input rounded (:func:`emulating`); with a file, its other parameters stored narrower
        than f32 too.

        Raises:
            AudioparityError: an LSTM with a projection; a convolution kernel a file stores as
                a block type.
        """
        for name, module, kind in matmul_modules(model, keep):
            if kind == "embedding":
                self.store(f"{name}.weight", module.weight)
            elif kind == "lstm":
                types = {param: self.store(f"{name}.{param}", getattr(module, param)) or "f32"
                         for param, _ in module.named_parameters() if param.startswith("weight_")}
                module.forward = _LstmSteps(module, types)
                self.lstms.append(module)
            else:
                storage = self.store(f"{name}.weight", module.weight)
                if storage is not None:
                    self.round_input(module, storage, channels_last=kind == "linear")
        if isinstance(self.policy, FileStorage):
            self.apply_narrow(model, keep)
            names = {name.removeprefix(self.prefix) for name, _ in (
                *model.named_parameters(remove_duplicate=False), *model.named_buffers())}
            unused = sorted(set(self.policy.tensors) - names)
            if unused:
                self.notes.append(f"{len(unused)} tensor(s) of the candidate's file are no "
                                  f"weight of the reference model: {', '.join(unused)}")

    def apply_narrow(self, model: Any, keep: Collection[str]) -> None:
        """The parameters other than matmul weights that the file stores narrower than f32
        (:func:`emulating`), a convolution's input rounded for its kernel's type.

        Raises:
            AudioparityError: a convolution kernel stored as a block type.
        """
        import torch

        for module_name, module in model.named_modules():
            if module_name in keep:
                continue
            for param_name, param in module.named_parameters(recurse=False):
                full = f"{module_name}.{param_name}" if module_name else param_name
                found = self.policy.tensors.get(full.removeprefix(self.prefix))
                if id(param) in self.types or found is None or found.type == "f32":
                    continue
                conv = isinstance(module, torch.nn.Conv1d | torch.nn.Conv2d) \
                    and param_name == "weight"
                if conv and found.type not in FLOAT_STORAGE_TYPES:
                    raise AudioparityError(f"{full}: the candidate's file stores this "
                                           f"convolution kernel as {found.type}; ggml's im2col "
                                           f"takes {' or '.join(FLOAT_STORAGE_TYPES)} only")
                storage = self.store(full, param, matrix_shape(param.shape))
                if conv and storage is not None:
                    self.round_input(module, storage, channels_last=False)

    def restore(self) -> None:
        """The model float32 again: hooks removed, LSTMs' own forward, weights copied back."""
        import torch

        for hook in self.hooks:
            hook.remove()
        for module in self.lstms:
            del module.forward
        with torch.no_grad():
            for param, original in self.originals.values():
                param.copy_(original)


def _rounded(tensor, storage: str, channels_last: bool):
    """torch ``tensor`` through :func:`matmul_input`, along its last axis or (``channels_last``
    False, a conv input ``[N, C, T]`` or ``[N, C, H, W]``) along axis 1."""
    import torch

    array = tensor.detach().float().numpy()
    if not channels_last:
        array = np.moveaxis(array, 1, -1)
    out = matmul_input(array, storage)
    if not channels_last:
        out = np.moveaxis(out, -1, 1)
    return torch.from_numpy(np.ascontiguousarray(out)).to(tensor.dtype)


def _min_term(tensor, weight, storage: str, channels_last: bool):
    """torch ``tensor``'s :func:`min_term` for ``weight`` (as stored; a pointwise kernel's
    trailing axes dropped), laid out as the module's output (channels on axis 1 for a conv)."""
    import torch

    array = tensor.detach().float().numpy()
    if not channels_last:
        array = np.moveaxis(array, 1, -1)
    w = weight.detach().numpy()
    out = min_term(array, w.reshape(w.shape[0], -1), storage)
    if not channels_last:
        out = np.moveaxis(out, -1, 1)
    return torch.from_numpy(np.ascontiguousarray(out)).to(tensor.dtype)


def _product(tensor, weight, storage: str):
    """``tensor @ weight.T`` as ggml's CPU backend computes it with ``weight`` stored as
    ``storage`` (already rounded): the input rounded, plus the :func:`min_term`."""
    product = _rounded(tensor, storage, True) @ weight.T
    if VEC_DOT_TYPES[storage] == "q8_1":
        product = product + _min_term(tensor, weight, storage, True)
    return product


class _LstmSteps:
    """``nn.LSTM.forward`` one step at a time, each matmul's input (``x_t``, ``h_{t-1}``)
    rounded for its weight's storage: ``gates = W_ih x + b_ih + W_hh h + b_hh``, then
    ``c = sigmoid(f) c + sigmoid(i) tanh(g)``, ``h = sigmoid(o) tanh(c)`` (torch's equations)."""

    def __init__(self, lstm, types: dict[str, str]) -> None:
        self.lstm, self.types = lstm, types

    def __call__(self, input, hx=None):
        import torch

        lstm = self.lstm
        x = input.transpose(0, 1) if lstm.batch_first else input  # [T, N, in]
        n, hidden = x.shape[1], lstm.hidden_size
        if hx is None:
            zeros = x.new_zeros(lstm.num_layers, n, hidden)
            hx = (zeros, zeros)
        h_n, c_n = [], []
        for layer in range(lstm.num_layers):
            w_ih, w_hh = (getattr(lstm, f"{kind}_l{layer}") for kind in ("weight_ih", "weight_hh"))
            bias = (getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
                    if lstm.bias else 0)
            h, c, outputs = hx[0][layer], hx[1][layer], []
            for x_t in x:
                gates = (_product(x_t, w_ih, self.types[f"weight_ih_l{layer}"])
                         + _product(h, w_hh, self.types[f"weight_hh_l{layer}"]) + bias)
                i, f, g, o = gates.chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outputs.append(h)
            x = torch.stack(outputs)
            h_n.append(h)
            c_n.append(c)
        output = x.transpose(0, 1) if lstm.batch_first else x
        return output, (torch.stack(h_n), torch.stack(c_n))


#: Joins a case's dump directory and an emulated weight type: ``clip@q8_0`` is the reference
#: dump of case ``clip`` computed as ggml does with q8_0 weights (no case name holds it).
EMULATED_SEPARATOR = "@"


def emulated_dir(output_dir: Path, weight_type: str | None) -> Path:
    """The dump directory of ``output_dir``'s case emulating ``weight_type`` (``None``: the
    float32 reference, ``output_dir`` itself)."""
    output_dir = Path(output_dir)
    if weight_type is None:
        return output_dir
    return output_dir.with_name(f"{output_dir.name}{EMULATED_SEPARATOR}{weight_type}")


@dataclass
class Emulation:
    """One model a reference job dumps with: the float32 model (``weight_type`` None), the
    model computing as ggml's CPU backend does with its matmul weights in ``weight_type``, or
    with a candidate's own stored weights (``storage``: the storage-matched reference)."""

    weight_type: str | None
    model: Any
    stored: StoredWeights
    storage: FileStorage | None = None

    def dump_dir(self, output_dir: Path) -> Path:
        """Where this model dumps the case of ``output_dir`` (:func:`emulated_dir`; a
        storage-matched reference's dumps are its job's own directories)."""
        return Path(output_dir) if self.storage else emulated_dir(output_dir, self.weight_type)

    @property
    def fields(self) -> dict[str, Any]:
        """Manifest fields of its dumps: ``emulates`` (weight type, backend, fallback notes; a
        storage file and its digest)."""
        if self.weight_type is None:
            return {}
        file = ({"storage": str(self.storage.path), "storage_digest": self.storage.digest}
                if self.storage else {})
        return {"emulates": {"weight_type": self.weight_type, "backend": "cpu", **file,
                             "notes" if self.storage else "fallbacks": self.stored.notes}}


def emulations(model: Any, weight_types: Sequence[str | Recipe] | FileStorage,
               keep: Collection[str] = (), prefix: str = "") -> Iterator[Emulation]:
    """The float32 ``model``, then the same model computing as ggml does with each of
    ``weight_types`` (a type, or a :class:`Recipe`; :func:`emulating`, ``keep`` and ``prefix``
    passed on), one at a time: each is float32 again once the next is asked for (NeMo models
    cannot be deep-copied). Given a candidate's stored weights (:class:`FileStorage`) instead,
    only the model computing with those (the storage-matched reference).

    Raises:
        AudioparityError: a weight type that is not emulated (before any model is yielded).
    """
    if isinstance(weight_types, FileStorage):
        with emulating(model, weight_types, keep, prefix) as stored_weights:
            yield Emulation(weight_types.weight_type, model, stored_weights, weight_types)
        return
    recipes = [t if isinstance(t, Recipe) else Recipe.uniform(t) for t in weight_types]
    unknown = [r.base for r in recipes if r.base not in EMULATED_TYPES]
    if unknown:
        raise AudioparityError(f"no quantization-aware reference for weight type(s) "
                               f"{', '.join(unknown)}; emulated: {', '.join(EMULATED_TYPES)}")
    yield Emulation(None, model, StoredWeights())
    for recipe in recipes:
        with emulating(model, recipe, keep, prefix) as stored_weights:
            yield Emulation(recipe.weight_type if recipe.name else recipe.base, model,
                            stored_weights)
