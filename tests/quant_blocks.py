"""ggml's quantized block formats in numpy, written from ggml's C source and independent of
ggml and of :mod:`audioparity.dumping.storage`: the truths ``tests/test_quants.py`` holds both to.

A row of ``n`` values of a block type is ``n / BLOCK_VALUES[type]`` blocks laid out back to
back, each a packed little-endian C struct of ``ggml-common.h`` (:data:`LAYOUTS`, a numpy
structured dtype per struct, no padding). :func:`decode` reads a row back to float32 as the
type's ``dequantize_row_*`` of ``ggml-quants.c`` does, with the same float32 operations in the
same order. The quantizers return a row's raw bytes (uint8, ``n / BLOCK_VALUES[type] *
itemsize``) as ggml writes them:

- :func:`quantize_q8_0`, :func:`quantize_q4_0`, :func:`quantize_q4_1`, :func:`quantize_q5_0`,
  :func:`quantize_q5_1`: ``quantize_row_*_ref`` of ``ggml-quants.c``, what
  ``ggml_quantize_chunk`` stores for these types without an importance matrix;
- :func:`quantize_q8_0_x86`, :func:`quantize_q8_1_x86`: ``quantize_row_q8_0`` and
  ``quantize_row_q8_1`` of ``ggml-cpu/arch/x86/quants.c`` (the AVX/AVX2 branch), how the CPU
  backend rounds a matmul input for a weight whose ``vec_dot_type`` is q8_0 or q8_1;
- :func:`quantize_q8_K`: ``quantize_row_q8_K_ref`` of ``ggml-quants.c``, which the CPU backend's
  ``quantize_row_q8_K`` calls on x86: the input rounding for the k-quants;
- :func:`quantize_f16`, :func:`quantize_bf16`: ``ggml_compute_fp32_to_fp16`` and
  ``ggml_compute_fp32_to_bf16`` of ``ggml-impl.h`` (``ggml_quantize_chunk`` for f16 and bf16).

Where C converts a float to a narrower integer (``(int8_t)f``, ``(uint8_t)f``) the quantizers do
what x86 does: truncate toward zero to int32 (``cvttss2si``; NaN and values out of the int32
range give ``INT32_MIN``) and keep the low byte. Finite inputs never reach the out-of-range
case but for a block of float32 subnormals, whose reciprocal scale overflows to inf.
"""

from __future__ import annotations

import numpy as np

#: Values per block of ggml's 32-value block types (``QK4_0`` ... ``QK8_1``, ``QK4_NL``,
#: ``QK_MXFP4``).
QK = 32
#: Values per super-block of the k-quants (``QK_K``).
QK_K = 256

#: Each block type's C struct of ``ggml-common.h`` as a packed little-endian numpy dtype: f16
#: fields (``ggml_half``) as ``<f2``, ``uint8_t``/``int8_t`` arrays as ``u1``/``i1``, q5's
#: ``uint8_t qh[4]`` as the ``uint32_t`` the C code ``memcpy``s it into, q8_K's float ``d`` as
#: ``<f4`` and its ``int16_t bsums`` as ``<i2``.
LAYOUTS: dict[str, np.dtype] = {name: np.dtype(fields) for name, fields in {
    # block_q4_0: x = d * (q - 8), q the nibbles: low of qs[j] is value j, high value j + 16
    "q4_0": [("d", "<f2"), ("qs", "u1", (QK // 2,))],
    # block_q4_1: x = d * q + m
    "q4_1": [("d", "<f2"), ("m", "<f2"), ("qs", "u1", (QK // 2,))],
    # block_q5_0: x = d * (q - 16), q's fifth bit of value j in bit j of qh
    "q5_0": [("d", "<f2"), ("qh", "<u4"), ("qs", "u1", (QK // 2,))],
    # block_q5_1: x = d * q + m
    "q5_1": [("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", (QK // 2,))],
    # block_q8_0: x = d * q
    "q8_0": [("d", "<f2"), ("qs", "i1", (QK,))],
    # block_q8_1: x = d * q; s = d * sum(q) (for the q4_1/q5_1 dot products' min term)
    "q8_1": [("d", "<f2"), ("s", "<f2"), ("qs", "i1", (QK,))],
    # block_iq4_nl: x = d * kvalues_iq4nl[q], nibbles as q4_0
    "iq4_nl": [("d", "<f2"), ("qs", "u1", (QK // 2,))],
    # block_mxfp4: x = kvalues_mxfp4[q] * 2^(e - 128) (E8M0 scale, halved: the table is doubled)
    "mxfp4": [("e", "u1"), ("qs", "u1", (QK // 2,))],
    # block_q2_K: 16 sub-blocks of 16, scales = 4-bit scale | 4-bit min << 4, 2-bit quants
    "q2_K": [("scales", "u1", (QK_K // 16,)), ("qs", "u1", (QK_K // 4,)), ("d", "<f2"),
             ("dmin", "<f2")],
    # block_q3_K: 16 sub-blocks of 16, 6-bit signed scales packed in 12 bytes, 2 low bits in
    # qs and the third (set: +0, clear: -4) in hmask
    "q3_K": [("hmask", "u1", (QK_K // 8,)), ("qs", "u1", (QK_K // 4,)), ("scales", "u1", (12,)),
             ("d", "<f2")],
    # block_q4_K: 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes (K_SCALE_SIZE)
    "q4_K": [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (QK_K // 2,))],
    # block_q5_K: as q4_K, the fifth bit of each quant in qh
    "q5_K": [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qh", "u1", (QK_K // 8,)),
             ("qs", "u1", (QK_K // 2,))],
    # block_q6_K: 16 sub-blocks of 16, int8 scales, 4 low bits in ql and 2 high bits in qh
    "q6_K": [("ql", "u1", (QK_K // 2,)), ("qh", "u1", (QK_K // 4,)),
             ("scales", "i1", (QK_K // 16,)), ("d", "<f2")],
    # block_q8_K: x = d * q (d float32); bsums = sums of q by 16 (for the k-quant dot products)
    "q8_K": [("d", "<f4"), ("qs", "i1", (QK_K,)), ("bsums", "<i2", (QK_K // 16,))],
}.items()}

#: Values per block of each block type (``ggml_blck_size``).
BLOCK_VALUES = {name: QK_K if name.endswith("_K") else QK for name in LAYOUTS}

#: ``kvalues_iq4nl`` of ``ggml-common.h``: iq4_nl's non-linear 4-bit grid.
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                          1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)

#: ``kvalues_mxfp4`` of ``ggml-common.h``: the sixteen E2M1 (fp4) values, doubled so they are
#: integers (sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6 times two).
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)

_F32 = np.float32


def blocks_of(raw: np.ndarray, type_name: str, n: int) -> np.ndarray:
    """The ``n / BLOCK_VALUES[type_name]`` blocks of the row ``raw`` (uint8), as a structured
    array of :data:`LAYOUTS` ``[type_name]`` (a view).

    Raises:
        ValueError: an unknown type, ``n`` no multiple of the block, or ``raw`` of another size.
    """
    layout = LAYOUTS[type_name]
    count, rest = divmod(n, BLOCK_VALUES[type_name])
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if rest or raw.size != count * layout.itemsize:
        raise ValueError(f"{type_name}: {raw.size} bytes do not hold {n} values")
    return raw.view(layout)


def _f16(field: np.ndarray) -> np.ndarray:
    """An f16 field as float32, exactly (``GGML_FP16_TO_FP32``), with a trailing axis of 1."""
    return field.astype(_F32)[:, None]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``[blocks, 16]`` bytes -> ``[blocks, 32]`` quants: the low nibbles are values 0..15, the
    high ones 16..31 (q4_0, q4_1, q5_*, iq4_nl, mxfp4)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """q5_0/q5_1's ``qh`` (uint32 per block) -> ``[blocks, 32]``: bit j, as 0 or 16."""
    return ((qh[:, None] >> np.arange(QK, dtype=np.uint32)) & 1).astype(np.uint8) << 4


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """mxfp4's E8M0 exponent byte -> float32 ``2^(e - 128)`` (``ggml_e8m0_to_fp32_half`` of
    ``ggml-impl.h``: half the E8M0 value; e 0 and 1 are the float32 subnormals 2^-128, 2^-127;
    e 255 is 2^127, not NaN)."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
    return bits.view(_F32)


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q4_K/q5_K's 12 packed bytes ``[blocks, 12]`` -> the 6-bit scales and mins ``[blocks, 8]``
    of the 8 sub-blocks (``get_scale_min_k4``): sub-blocks 0..3 in the low 6 bits of bytes 0..3
    (scales) and 4..7 (mins); sub-blocks 4..7 take their low 4 bits from the nibbles of bytes
    8..11 (scale low, min high) and their top 2 bits from the top bits of bytes 0..3 (scales)
    and 4..7 (mins)."""
    q = scales.astype(np.uint8)
    low_sc, low_m = q[:, 0:4] & 63, q[:, 4:8] & 63
    high_sc = (q[:, 8:12] & 0x0F) | ((q[:, 0:4] >> 6) << 4)
    high_m = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
    return (np.concatenate([low_sc, high_sc], axis=1), np.concatenate([low_m, high_m], axis=1))


def _q3_k_scales(scales: np.ndarray) -> np.ndarray:
    """q3_K's 12 packed bytes ``[blocks, 12]`` -> the 16 signed sub-block scales ``[blocks,
    16]`` (int, -32..31; ``dequantize_row_q3_K``'s ``aux`` shuffle): scale j's low 4 bits are
    nibble ``j // 8`` of byte ``j % 8``, its high 2 bits are bits ``2 * (j // 4)`` of byte
    ``8 + j % 4``; the 6-bit value less 32."""
    j = np.arange(16)
    low = (scales[:, j % 8] >> (4 * (j // 8))) & 0x0F
    high = (scales[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    return (low | (high << 4)).astype(np.int32) - 32


def _k_index() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For value e of a 256-value super-block of q2_K/q3_K: its half ``h = e // 128``, quarter
    ``j`` within the half (whose 2 bits sit at shift ``2 j``) and lane ``l`` (0..31)."""
    e = np.arange(QK_K)
    return e // 128, (e % 128) // 32, e % 32


def _decode_q4_0(b: np.ndarray) -> np.ndarray:
    """``dequantize_row_q4_0``: ``(q - 8) * d``."""
    return (_nibbles(b["qs"]).astype(np.int32) - 8).astype(_F32) * _f16(b["d"])


def _affine(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``q * d + m`` as ggml's C computes it on x86 (a product, then a sum: two roundings): a
    NaN product (``0 * inf``, the default NaN) stays itself, as ``addss`` returns its first
    NaN operand, where numpy's broadcast sum may return ``m``'s NaN instead."""
    product = q.astype(_F32) * d
    return np.where(np.isnan(product), product, product + m)


def _decode_q4_1(b: np.ndarray) -> np.ndarray:
    """``dequantize_row_q4_1``: ``q * d + m`` (:func:`_affine`)."""
    return _affine(_nibbles(b["qs"]), _f16(b["d"]), _f16(b["m"]))


def _decode_q5_0(b: np.ndarray) -> np.ndarray:
    """``dequantize_row_q5_0``: ``((nibble | fifth bit) - 16) * d``."""
    q = (_nibbles(b["qs"]) | _fifth_bits(b["qh"])).astype(np.int32) - 16
    return q.astype(_F32) * _f16(b["d"])


def _decode_q5_1(b: np.ndarray) -> np.ndarray:
    """``dequantize_row_q5_1``: ``(nibble | fifth bit) * d + m`` (:func:`_affine`)."""
    return _affine(_nibbles(b["qs"]) | _fifth_bits(b["qh"]), _f16(b["d"]), _f16(b["m"]))


def _decode_q8(b: np.ndarray) -> np.ndarray:
    """``dequantize_row_q8_0`` (and q8_1, which ggml reads only in dot products: ``d * q``;
    ``s`` is redundant): ``q * d``."""
    return b["qs"].astype(_F32) * _f16(b["d"])


def _decode_iq4_nl(b: np.ndarray) -> np.ndarray:
    """``dequantize_row_iq4_nl``: ``d * kvalues_iq4nl[q]``."""
    return _f16(b["d"]) * KVALUES_IQ4NL[_nibbles(b["qs"])].astype(_F32)


def _decode_mxfp4(b: np.ndarray) -> np.ndarray:
    """``dequantize_row_mxfp4``: ``kvalues_mxfp4[q] * e8m0_half(e)``."""
    return KVALUES_MXFP4[_nibbles(b["qs"])].astype(_F32) * _e8m0_half(b["e"])[:, None]


def _decode_q2_k(b: np.ndarray) -> np.ndarray:
    """``dequantize_row_q2_K``: value e of sub-block ``s = e // 16``: ``dl * q - ml``, ``dl = d
    * (scales[s] & 15)``, ``ml = dmin * (scales[s] >> 4)``, q bits ``2 j`` of ``qs[32 h + l]``
    (:func:`_k_index`)."""
    h, j, lane = _k_index()
    q = (b["qs"][:, 32 * h + lane] >> (2 * j)) & 3
    sc = b["scales"][:, np.arange(QK_K) // 16]
    dl = _f16(b["d"]) * (sc & 0x0F).astype(_F32)
    ml = _f16(b["dmin"]) * (sc >> 4).astype(_F32)
    return dl * q.astype(_F32) - ml


def _decode_q3_k(b: np.ndarray) -> np.ndarray:
    """``dequantize_row_q3_K``: value e of sub-block ``s = e // 16``: ``dl * (q - (hbit ? 0 :
    4))``, ``dl = d * scale_s`` (:func:`_q3_k_scales`), q bits ``2 j`` of ``qs[32 h + l]``,
    hbit bit ``4 h + j`` of ``hmask[l]``."""
    h, j, lane = _k_index()
    q = ((b["qs"][:, 32 * h + lane] >> (2 * j)) & 3).astype(np.int32)
    hbit = (b["hmask"][:, lane] >> (4 * h + j)) & 1
    q = q - np.where(hbit != 0, 0, 4)
    dl = _f16(b["d"]) * _q3_k_scales(b["scales"])[:, np.arange(QK_K) // 16].astype(_F32)
    return dl * q.astype(_F32)


def _decode_q45_k(b: np.ndarray, fifth: bool) -> np.ndarray:
    """``dequantize_row_q4_K`` (``fifth`` False) and ``dequantize_row_q5_K``: value e of
    sub-block ``s = e // 32``, lane ``l = e % 32``: ``(d * sc_s) * q - dmin * m_s``
    (:func:`_scale_min_k4`); q is nibble ``s % 2`` of ``qs[32 (s // 2) + l]``, plus 16 where
    bit s of ``qh[l]`` is set (q5_K)."""
    e = np.arange(QK_K)
    s, lane = e // 32, e % 32
    q = ((b["qs"][:, 32 * (s // 2) + lane] >> (4 * (s % 2))) & 0x0F).astype(np.int32)
    if fifth:
        q = q + 16 * ((b["qh"][:, lane] >> s) & 1).astype(np.int32)
    sc, m = _scale_min_k4(b["scales"])
    d1 = _f16(b["d"]) * sc[:, s].astype(_F32)
    m1 = _f16(b["dmin"]) * m[:, s].astype(_F32)
    return d1 * q.astype(_F32) - m1


def _decode_q6_k(b: np.ndarray) -> np.ndarray:
    """``dequantize_row_q6_K``: value ``e = 128 h + 32 k + l``: ``(d * scales[e // 16]) * (q -
    32)``, q's low 4 bits nibble ``k // 2`` of ``ql[64 h + 32 (k % 2) + l]``, high 2 bits bits
    ``2 k`` of ``qh[32 h + l]``."""
    e = np.arange(QK_K)
    h, k, lane = e // 128, (e % 128) // 32, e % 32
    low = (b["ql"][:, 64 * h + 32 * (k % 2) + lane] >> (4 * (k // 2))) & 0x0F
    high = (b["qh"][:, 32 * h + lane] >> (2 * k)) & 3
    q = (low | (high << 4)).astype(np.int32) - 32
    ds = _f16(b["d"]) * b["scales"][:, e // 16].astype(_F32)
    return ds * q.astype(_F32)


def _decode_q8_k(b: np.ndarray) -> np.ndarray:
    """``dequantize_row_q8_K``: ``d * q``, d float32."""
    return b["d"].astype(_F32)[:, None] * b["qs"].astype(_F32)


_DECODERS = {
    "q4_0": _decode_q4_0, "q4_1": _decode_q4_1, "q5_0": _decode_q5_0, "q5_1": _decode_q5_1,
    "q8_0": _decode_q8, "q8_1": _decode_q8, "iq4_nl": _decode_iq4_nl, "mxfp4": _decode_mxfp4,
    "q2_K": _decode_q2_k, "q3_K": _decode_q3_k,
    "q4_K": lambda b: _decode_q45_k(b, fifth=False), "q5_K": lambda b: _decode_q45_k(b, True),
    "q6_K": _decode_q6_k, "q8_K": _decode_q8_k,
}


def decode(raw: np.ndarray, type_name: str, n: int) -> np.ndarray:
    """The row of ``n`` values that ``raw`` (uint8, its blocks back to back) holds as
    ``type_name``, float32 ``[n]``: for a block type, its ``dequantize_row_*`` (q8_1, which has
    none, as ``d * q``); for the float types, ``f16`` (numpy's exact widening, as
    ``GGML_FP16_TO_FP32``), ``bf16`` (the 16 bits as a float32's top half) and ``f32``.

    Raises:
        ValueError: an unknown type, or ``raw`` not ``n`` values of it.
    """
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    floats = {"f32": (np.float32, 4), "f16": (np.float16, 2), "bf16": (np.uint16, 2)}
    if type_name in floats:
        dtype, width = floats[type_name]
        if raw.size != n * width:
            raise ValueError(f"{type_name}: {raw.size} bytes do not hold {n} values")
        values = raw.view(dtype)
        if type_name == "bf16":
            return (values.astype(np.uint32) << 16).view(_F32)
        return values.astype(_F32)
    if type_name not in _DECODERS:
        raise ValueError(f"no decoder for {type_name!r}")
    with np.errstate(invalid="ignore", over="ignore"):  # inf scales give inf and NaN, as in C
        return _DECODERS[type_name](blocks_of(raw, type_name, n)).astype(_F32).reshape(-1)


# --- quantizers ---------------------------------------------------------------------------------


def _blocks(x: np.ndarray, size: int) -> np.ndarray:
    """A row of float32 values ``[n]`` -> ``[n / size, size]``.

    Raises:
        ValueError: ``n`` no multiple of ``size``.
    """
    x = np.ascontiguousarray(x, dtype=_F32).reshape(-1)
    if x.size % size:
        raise ValueError(f"{x.size} values are no whole number of blocks of {size}")
    return x.reshape(-1, size)


def _to_f16(x: np.ndarray) -> np.ndarray:
    """float32 -> f16, rounded to nearest even, beyond the f16 range inf (``GGML_FP32_TO_FP16``
    and the CPU's ``_cvtss_sh``; NaN inputs are not covered)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=_F32).astype(np.float16)


def _c_int32(f: np.ndarray) -> np.ndarray:
    """C's float -> integer conversion on x86 (``cvttss2si``): toward zero; NaN, inf and values
    outside the int32 range give ``INT32_MIN``. int64."""
    f = np.asarray(f, dtype=_F32)
    fits = np.isfinite(f) & (np.abs(f.astype(np.float64)) < 2.0**31)
    return np.where(fits, np.trunc(np.where(fits, f, 0)), -(2.0**31)).astype(np.int64)


def _low_byte(v: np.ndarray) -> np.ndarray:
    """An integer stored to an ``uint8_t``: its low byte."""
    return (np.asarray(v, dtype=np.int64) & 0xFF).astype(np.uint8)


def _signed_byte(v: np.ndarray) -> np.ndarray:
    """An integer stored to an ``int8_t``: its low byte, two's complement."""
    return _low_byte(v).view(np.int8)


def _roundf(f: np.ndarray) -> np.ndarray:
    """C's ``roundf``: to nearest, halves away from zero (float32 in and out; ``f - trunc(f)``
    is exact, so the tie test is too)."""
    f = np.asarray(f, dtype=_F32)
    whole = np.trunc(f)
    return (whole + np.where(np.abs(f - whole) >= 0.5, np.sign(f), 0)).astype(_F32)


def _signed_max(blocks: np.ndarray) -> np.ndarray:
    """Per block ``[blocks, 1]``: the value of largest magnitude, the first of equal magnitudes
    (the C loops update on ``amax < fabsf(v)``), +0.0 for a block of zeros (the loops' start)."""
    magnitude = np.abs(blocks)
    first = np.take_along_axis(blocks, magnitude.argmax(axis=1)[:, None], axis=1)
    return np.where(magnitude.max(axis=1, keepdims=True) > 0, first, _F32(0))


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """``[blocks, 32]`` quants (uint8) -> ``[blocks, 16]`` bytes: ``q[j] | q[j + 16] << 4``
    truncated to a byte (as ``y[i].qs[j] = xi0; y[i].qs[j] |= xi1 << 4``)."""
    half = q.shape[1] // 2
    return _low_byte(q[:, :half].astype(np.int64) | (q[:, half:].astype(np.int64) << 4))


def _pack_fifth_bits(q: np.ndarray) -> np.ndarray:
    """``[blocks, 32]`` 5-bit quants -> q5's ``qh``: bit 4 of value j at bit j (uint32)."""
    bits = ((q.astype(np.uint32) & 0x10) >> 4) << np.arange(QK, dtype=np.uint32)
    return np.bitwise_or.reduce(bits, axis=1).astype(np.uint32)


def _reciprocal(d: np.ndarray) -> np.ndarray:
    """``d ? 1.0f/d : 0.0f`` in float32 (inf where d is a float32 subnormal)."""
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(d != 0, _F32(1) / np.where(d != 0, d, _F32(1)), _F32(0)).astype(_F32)


def _row(layout: str, **fields: np.ndarray) -> np.ndarray:
    """Blocks of ``LAYOUTS[layout]`` filled from ``fields``, as the row's raw bytes."""
    count = len(next(iter(fields.values())))
    out = np.zeros(count, dtype=LAYOUTS[layout])
    for name, value in fields.items():
        out[name] = value
    return out.view(np.uint8)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q8_0_ref``: per block of 32, ``d = amax / 127`` (stored f16), ``id = 1 / d``
    (0 for d 0) from the float32 d, ``q = (int8_t) roundf(x * id)`` (halves away from zero).
    The row's raw bytes."""
    blocks = _blocks(x, QK)
    with np.errstate(over="ignore", invalid="ignore"):
        amax = np.abs(blocks).max(axis=1, keepdims=True)
        d = (amax / _F32(127)).astype(_F32)
        q = _signed_byte(_c_int32(_roundf(blocks * _reciprocal(d))))
    return _row("q8_0", d=_to_f16(d[:, 0]), qs=q)


def _quantize_signed(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """q4_0 (``levels`` 16) and q5_0 (32), ``quantize_row_q{4,5}_0_ref``: ``d = max / -(levels /
    2)`` with max the signed value of largest magnitude (:func:`_signed_max`; so max maps to
    quant 0), ``id = 1 / d``, ``q = min(levels - 1, (int8_t)(x * id + (levels / 2 + 0.5)))``.
    The float32 d ``[blocks]`` and the quants ``[blocks, 32]`` (uint8)."""
    blocks = _blocks(x, QK)
    half = levels // 2
    with np.errstate(over="ignore", invalid="ignore"):
        d = (_signed_max(blocks) / _F32(-half)).astype(_F32)
        scaled = (blocks * _reciprocal(d)).astype(_F32)
        shifted = (scaled + _F32(half + 0.5)).astype(_F32)
    q = np.minimum(levels - 1, _signed_byte(_c_int32(shifted)).astype(np.int64))
    return d[:, 0], _low_byte(q)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q4_0_ref`` (:func:`_quantize_signed` with 16 levels); the row's raw
    bytes."""
    d, q = _quantize_signed(x, 16)
    return _row("q4_0", d=_to_f16(d), qs=_pack_nibbles(q))


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q5_0_ref`` (:func:`_quantize_signed` with 32 levels): the low nibbles
    packed as q4_0, the fifth bits in ``qh``; the row's raw bytes."""
    d, q = _quantize_signed(x, 32)
    return _row("q5_0", d=_to_f16(d), qh=_pack_fifth_bits(q), qs=_pack_nibbles(q & 0x0F))


def _quantize_affine(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q4_1 (``levels`` 16) and q5_1 (32), ``quantize_row_q{4,5}_1_ref``: ``d = (max - min) /
    (levels - 1)``, ``id = 1 / d``, ``q = (x - min) * id + 0.5`` converted to an integer (q4_1:
    ``(int8_t)`` then at most 15; q5_1: ``(uint8_t)``, no bound). min and max are the first
    block values equal to the minimum and maximum (the C loops update on ``v < min``, ``v >
    max``: which of -0.0 and +0.0 is kept matters to the stored f16 bits). The float32 d and min
    ``[blocks]`` and the quants ``[blocks, 32]`` (uint8)."""
    blocks = _blocks(x, QK)
    low = np.take_along_axis(blocks, blocks.argmin(axis=1)[:, None], axis=1)
    high = np.take_along_axis(blocks, blocks.argmax(axis=1)[:, None], axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        d = ((high - low) / _F32(levels - 1)).astype(_F32)
        scaled = ((blocks - low) * _reciprocal(d)).astype(_F32)
        shifted = (scaled + _F32(0.5)).astype(_F32)
    whole = _c_int32(shifted)
    if levels == 16:
        q = _low_byte(np.minimum(15, _signed_byte(whole).astype(np.int64)))
    else:
        q = _low_byte(whole)
    return d[:, 0], low[:, 0], q


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q4_1_ref`` (:func:`_quantize_affine` with 16 levels); the row's raw
    bytes."""
    d, low, q = _quantize_affine(x, 16)
    return _row("q4_1", d=_to_f16(d), m=_to_f16(low), qs=_pack_nibbles(q))


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q5_1_ref`` (:func:`_quantize_affine` with 32 levels): nibbles ``q & 15``,
    fifth bits in ``qh``; the row's raw bytes."""
    d, low, q = _quantize_affine(x, 32)
    return _row("q5_1", d=_to_f16(d), m=_to_f16(low), qh=_pack_fifth_bits(q),
                qs=_pack_nibbles(q & 0x0F))


def _x86_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The AVX branch of ``quantize_row_q8_0``/``quantize_row_q8_1`` (``ggml-cpu/arch/x86``):
    ``d = amax / 127``, ``id = 127 / amax`` (not ``1 / d``; 0 for amax 0), ``x * id`` rounded
    to nearest even (``_mm256_round_ps``), converted to int32 (``_mm256_cvtps_epi32``: NaN and
    out of range give ``INT32_MIN``) and saturated to int8 by the two ``packs``. The float32 d
    ``[blocks]``, the int32 values before saturation ``[blocks, 32]`` (int64) and the quants
    ``[blocks, 32]`` (int8)."""
    blocks = _blocks(x, QK)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        amax = np.abs(blocks).max(axis=1, keepdims=True)
        d = (amax / _F32(127)).astype(_F32)
        inverse = np.where(amax != 0, _F32(127) / np.where(amax != 0, amax, _F32(1)), _F32(0))
        rounded = np.rint((blocks * inverse.astype(_F32)).astype(_F32))
    fits = np.isfinite(rounded) & (np.abs(rounded.astype(np.float64)) < 2.0**31)
    whole = np.where(fits, np.where(fits, rounded, 0), -(2.0**31)).astype(np.int64)
    return d[:, 0], whole, np.clip(whole, -128, 127).astype(np.int8)


def quantize_q8_0_x86(x: np.ndarray) -> np.ndarray:
    """The x86 CPU backend's ``quantize_row_q8_0`` (:func:`_x86_q8`): d stored f16; the row's
    raw bytes."""
    d, _, q = _x86_q8(x)
    return _row("q8_0", d=_to_f16(d), qs=q)


def quantize_q8_1_x86(x: np.ndarray) -> np.ndarray:
    """The x86 CPU backend's ``quantize_row_q8_1`` (:func:`_x86_q8`), with ``s = d * sum``
    (stored f16) of the float32 d and the int32 sum of the values before their saturation to
    int8, wrapping as the 32-bit adds do (a block of float32 subnormals: 32 ``INT32_MIN``, sum
    0); the row's raw bytes."""
    d, whole, q = _x86_q8(x)
    total = (whole.sum(axis=1) & 0xFFFFFFFF).astype(np.uint32).view(np.int32).astype(_F32)
    with np.errstate(over="ignore", invalid="ignore"):
        s = (d * total).astype(_F32)
    return _row("q8_1", d=_to_f16(d), s=_to_f16(s), qs=q)


def nearest_int(f: np.ndarray) -> np.ndarray:
    """``nearest_int`` of ``ggml-quants.c``: ``f + 12582912`` (1.5 * 2^23) in float32, whose low
    23 bits less 2^22 are f rounded to nearest even (for ``|f| <= 4194303``; beyond, and for inf
    and NaN, whatever those bits hold, as in C). int64."""
    with np.errstate(over="ignore", invalid="ignore"):
        shifted = (np.asarray(f, dtype=_F32) + _F32(12582912)).astype(_F32)
    return (shifted.view(np.int32).astype(np.int64) & 0x007FFFFF) - 0x00400000


def quantize_q8_K(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q8_K_ref``: per super-block of 256, max the signed value of largest
    magnitude (:func:`_signed_max`), ``iscale = -127 / max``, ``q = (int8_t) min(127,
    nearest_int(iscale * x))``, ``bsums`` the int16 sums of q by 16, ``d = 1 / iscale`` (float32;
    the value of max's sign flipped: ``-max / 127``). A block of zeros is d 0, q 0, and in C its
    bsums are left unwritten (here 0). The row's raw bytes."""
    blocks = _blocks(x, QK_K)
    top = _signed_max(blocks)
    zero = top[:, 0] == 0
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        iscale = (_F32(-127) / np.where(zero[:, None], _F32(1), top)).astype(_F32)
        v = nearest_int((iscale * blocks).astype(_F32))
        d = (_F32(1) / iscale[:, 0]).astype(_F32)
    q = _signed_byte(np.minimum(127, v))
    q[zero] = 0
    bsums = q.astype(np.int64).reshape(len(q), QK_K // 16, 16).sum(axis=2)
    bsums = (bsums & 0xFFFF).astype(np.uint16).view(np.int16)
    bsums[zero] = 0
    return _row("q8_K", d=np.where(zero, _F32(0), d), qs=q, bsums=bsums)


def quantize_f16(x: np.ndarray) -> np.ndarray:
    """float32 values -> their f16 bytes (``ggml_compute_fp32_to_fp16``: nearest even, beyond the
    f16 range inf; numpy's own conversion, NaN inputs not covered)."""
    return _to_f16(np.asarray(x, dtype=_F32).reshape(-1)).view(np.uint8)


def quantize_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values -> their bf16 bytes (``ggml_compute_fp32_to_bf16``): the top 16 bits after
    adding ``0x7fff`` and the lowest kept bit (nearest, ties to even); a NaN keeps its top bits
    with the quiet bit (64) set."""
    bits = np.asarray(x, dtype=_F32).reshape(-1).view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(nan, (bits >> 16) | 64, rounded).astype(np.uint16).view(np.uint8)
