"""ggml's weight types held to independent truths: the numpy block formats of
``tests/quant_blocks.py`` (written from ggml's C source) against ggml itself
(``ggml_quantize_chunk``, each type's ``to_float``, the CPU backend's ``from_float``) and against
:mod:`audioparity.dumping.storage` (``stored``, ``matmul_input``, ``VEC_DOT_TYPES``,
``BITS_PER_WEIGHT``, ``BLOCK_SIZES``). Every comparison is bit for bit (float32 values compared
as their uint32 bits, so -0.0, inf and NaN payloads count) unless a test says otherwise.

The inputs (:data:`EDGE_ROWS`, one row of 256 values per case, a whole k-quant super-block and
eight 32-value blocks) are those where a rounding rule shows: a block of zeros, values on exact
halves of a quantization step, magnitudes whose f16 scale is subnormal or flushes to zero,
float32 subnormals (whose reciprocal scale is inf), blocks whose largest magnitude is negative
or shared by +a and -a, f16 and bf16 ties, and values beyond the f16 range; then random rows
over seven decades (:func:`random_rows`).

Examples of the property test come from the Hypothesis profile (``HYPOTHESIS_PROFILE=ci``:
2000; tests/conftest.py).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from audioparity.contract.vocabulary import STORAGE_TYPES
from audioparity.dumping import storage
from tests import quant_blocks as qb

#: The storage types stored in blocks (all but the floats f32, f16, bf16).
BLOCK_TYPES = tuple(t for t in STORAGE_TYPES if t not in ("f32", "f16", "bf16"))

#: Types with a numpy quantizer of their own, bit-exact to what ``ggml_quantize_chunk`` writes.
QUANTIZERS = {"q8_0": qb.quantize_q8_0, "q4_0": qb.quantize_q4_0, "q4_1": qb.quantize_q4_1,
              "q5_0": qb.quantize_q5_0, "q5_1": qb.quantize_q5_1, "f16": qb.quantize_f16,
              "bf16": qb.quantize_bf16}

#: The x86 CPU backend's input rounding per ``vec_dot_type`` (the ``from_float`` of
#: ``type_traits_cpu``), in numpy.
INPUT_QUANTIZERS = {"q8_0": qb.quantize_q8_0_x86, "q8_1": qb.quantize_q8_1_x86,
                    "q8_K": qb.quantize_q8_K}


def _tile(block) -> np.ndarray:
    """A block of 32 values repeated to fill a row of 256."""
    return np.tile(np.asarray(block, dtype=np.float32), qb.QK_K // len(block))


#: Values x whose ``x * 127 / 1.4099537`` or ``x * (1 / (1.4099537 / 127))`` (float32) is an
#: exact half and the other not (found by search).
RECIPROCAL_TIES = (0.0055509987, 0.005550999, 0.016652996, 0.027754996, 0.03885699, 0.04995899)


def _edge_rows() -> dict[str, np.ndarray]:
    """The edge cases, name -> float32 ``[256]`` (see the module docstring)."""
    rng = np.random.default_rng(20240501)
    halves = np.arange(-16, 16) + 0.5                          # k + 1/2, k = -16 .. 15
    return {
        "zeros": np.zeros(256),
        "negative_zeros": np.full(256, -0.0),
        # q8_0 (d = 127 / 127 = 1): every x * id an exact half, rounded away from zero by the
        # weights' roundf and to even by the x86 input rounding
        "halves_q8_0": _tile(np.concatenate([[127.0], halves[:31] * 7])),
        # q4_0 (max -8: d = 1, x * id + 8.5 an integer) and q5_0 (max -16)
        "halves_q4_0": _tile(np.concatenate([[-8.0], halves[8:24], halves[8:23]])),
        "halves_q5_0": _tile(np.concatenate([[-16.0], halves[:31]])),
        # q4_1 (min 0, max 15: d = 1) and q5_1 (min 0, max 31)
        "halves_q4_1": _tile(np.concatenate([[0.0, 15.0], halves[16:31], halves[16:31]])),
        "halves_q5_1": _tile(np.concatenate([[0.0, 31.0], halves[16:32], halves[16:30] + 16])),
        # f16 ties (1 + 2^-11 between 1 and 1 + 2^-10) and bf16 ties (1 + 2^-8, 1 + 3 * 2^-8)
        "float_ties": _tile(np.concatenate([[1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8,
                                             1 + 3 * 2.0**-8, -(1 + 2.0**-8)],
                                            rng.uniform(-2, 2, 27)])),
        "tiny_1e-30": rng.standard_normal(256) * 1e-30,        # every f16 scale flushes to 0
        "amax_1e-3": rng.uniform(-1, 1, 256) * 1e-3,           # q8_0's d = 7.9e-6: f16 subnormal
        "amax_1e-6": rng.uniform(-1, 1, 256) * 1e-6,           # q4_0's d subnormal, q8_0's 0
        "f32_subnormal": rng.uniform(-1, 1, 256) * 1e-40,      # 1 / d overflows to inf
        # 127 / amax (the x86 input's id) and 1 / (amax / 127) (the weights' id) differ by an
        # ulp at this amax, and x * id is a tie with one of them and not with the other
        "reciprocals_q8_0": _tile(np.concatenate([[1.4099537], np.array(RECIPROCAL_TIES),
                                                  -np.array(RECIPROCAL_TIES),
                                                  rng.uniform(-1.4, 1.4, 19)])),
        "negative_max": np.concatenate([[-3.0], rng.uniform(-1, 1, 255)]),
        "plus_minus_max": _tile(np.concatenate([[2.0, -2.0], rng.uniform(-1, 1, 30)])),
        "minus_plus_max": _tile(np.concatenate([[-2.0, 2.0], rng.uniform(-1, 1, 30)])),
        "value_1e5": np.concatenate([[1e5], rng.standard_normal(255)]),   # beyond f16, d fits
        "value_-1e5": np.concatenate([[-1e5], rng.standard_normal(255)]),
        "value_1e9": np.concatenate([[1e9], rng.standard_normal(255)]),   # d beyond f16: inf
    }


#: :func:`_edge_rows`, computed once.
EDGE_ROWS = {name: row.astype(np.float32) for name, row in _edge_rows().items()}


def random_rows(rows: int = 16, seed: int = 0) -> np.ndarray:
    """float32 ``[rows, 256]``: normal values, each 32-value block scaled by ``10^u``, u uniform
    in [-4, 3], a third of the blocks shifted off zero (for the min-based types)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 8, 32)) * 10.0 ** rng.uniform(-4, 3, (rows, 8, 1))
    x += np.where(rng.random((rows, 8, 1)) < 1 / 3, 4 * np.abs(x).max(axis=2, keepdims=True), 0)
    return x.reshape(rows, 256).astype(np.float32)


#: Every test input: the edge rows then the random ones, float32 ``[rows, 256]``.
ROWS = np.concatenate([np.stack(list(EDGE_ROWS.values())), random_rows()])


def _row_of(name: str) -> int:
    return list(EDGE_ROWS).index(name)


# --- ggml, called directly ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ggml():
    """The ggml library, its CPU backend initialized (``from_float`` needs its tables)."""
    import ggml

    ggml.ggml_cpu_init()
    return ggml


def _type(ggml, name: str) -> int:
    return getattr(ggml, f"GGML_TYPE_{name.upper()}")


def _floats(x: np.ndarray):
    return x.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def _bytes(raw: np.ndarray):
    return raw.ctypes.data_as(ctypes.c_void_p)


def _row_bytes(ggml, name: str, x: np.ndarray) -> int:
    return ggml.ggml_row_size(_type(ggml, name), x.shape[-1]) * (x.size // x.shape[-1])


def ggml_quantize(ggml, x: np.ndarray, name: str) -> np.ndarray:
    """``ggml_quantize_chunk`` of rows ``x`` ``[rows, K]`` (no importance matrix): the bytes."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    raw = np.zeros(_row_bytes(ggml, name, x), dtype=np.uint8)
    written = ggml.ggml_quantize_chunk(_type(ggml, name), _floats(x), _bytes(raw), 0,
                                       x.shape[0], x.shape[1], None)
    assert written == raw.size
    return raw


def ggml_to_float(ggml, raw: np.ndarray, name: str, n: int) -> np.ndarray:
    """The type's ``to_float`` (``dequantize_row_*``) of ``n`` values; q8_K, whose
    ``to_float`` is NULL, through the exported ``dequantize_row_q8_K``."""
    out = np.zeros(n, dtype=np.float32)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if name == "q8_K":
        function = ggml.ggml.lib.dequantize_row_q8_K
        function.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64]
        function.restype = None
        function(_bytes(raw), _floats(out), n)
    else:
        traits = ggml.ggml_get_type_traits(_type(ggml, name)).contents
        assert traits.to_float, f"{name} has no to_float"
        traits.to_float(_bytes(raw), _floats(out), n)
    return out


def ggml_from_float(ggml, x: np.ndarray, name: str) -> np.ndarray:
    """The CPU backend's ``from_float`` of type ``name`` over all of ``x`` (the output buffer
    zeroed first: q8_K leaves a zero block's ``bsums`` unwritten)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    raw = np.zeros(_row_bytes(ggml, name, x), dtype=np.uint8)
    ggml.ggml_get_type_traits_cpu(_type(ggml, name)).contents.from_float(
        _floats(x), _bytes(raw), x.size)
    return raw


def assert_same_bits(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    """float32 arrays equal as uint32 bits, the first differences named."""
    a = np.ascontiguousarray(actual, dtype=np.float32).reshape(-1)
    e = np.ascontiguousarray(expected, dtype=np.float32).reshape(-1)
    assert a.shape == e.shape, f"{what}: shapes {a.shape} {e.shape}"
    differ = np.flatnonzero(a.view(np.uint32) != e.view(np.uint32))
    assert differ.size == 0, (f"{what}: {differ.size} values differ, first at {differ[:5]}: "
                              f"{a[differ[:5]]} != {e[differ[:5]]}")


# --- the tables ---------------------------------------------------------------------------------


def test_block_types_all_have_a_decoder():
    """Every block storage type of the vocabulary has an independent decoder here (a type
    added to STORAGE_TYPES without one fails)."""
    assert set(BLOCK_TYPES) <= set(qb.LAYOUTS)


@pytest.mark.parametrize("name", sorted(qb.LAYOUTS))
def test_layouts_are_ggml_structs(ggml, name):
    """Each numpy layout has the size and block length of ggml's struct (``type_size``,
    ``blck_size``): the structs were read from the same ggml the library was built from."""
    traits = ggml.ggml_get_type_traits(_type(ggml, name)).contents
    assert (qb.LAYOUTS[name].itemsize, qb.BLOCK_VALUES[name]) == (traits.type_size,
                                                                   traits.blck_size)


def test_vec_dot_types_are_ggml_cpu_traits(ggml):
    """``storage.VEC_DOT_TYPES`` names, for every storage type, the ``vec_dot_type`` of ggml's
    CPU type traits (the type a matmul's input is converted to)."""
    expected = {t: ggml.ggml_type_name(
        ggml.ggml_get_type_traits_cpu(_type(ggml, t)).contents.vec_dot_type).decode()
        for t in STORAGE_TYPES}
    assert storage.VEC_DOT_TYPES == expected


def test_block_sizes_and_bits_per_weight_are_ggml_traits(ggml):
    """``BLOCK_SIZES[t]`` is ggml's ``blck_size`` and ``BITS_PER_WEIGHT[t]`` is ``type_size *
    8 / blck_size``, for every storage type."""
    traits = {t: ggml.ggml_get_type_traits(_type(ggml, t)).contents for t in STORAGE_TYPES}
    assert storage.BLOCK_SIZES == {t: tr.blck_size for t, tr in traits.items()}
    assert storage.BITS_PER_WEIGHT == {t: tr.type_size * 8 / tr.blck_size
                                       for t, tr in traits.items()}


# --- weights: decode, ggml's to_float and stored() ----------------------------------------------


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_stored_blocks_decode_as_ggml_reads_them(ggml, name):
    """The bytes ``ggml_quantize_chunk`` writes for :data:`ROWS`, read by :func:`qb.decode`
    from the struct layout, are ggml's own ``to_float`` bit for bit, and so is
    ``storage.stored`` (a 3-D input: rows along the last axis)."""
    raw = ggml_quantize(ggml, ROWS, name)
    truth = qb.decode(raw, name, ROWS.size)
    assert_same_bits(ggml_to_float(ggml, raw, name, ROWS.size), truth, f"{name} to_float")
    assert_same_bits(storage.stored(ROWS[:, None, :], name), truth, f"stored {name}")


@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_stored_floats_are_numpy_rounding(ggml, name):
    """f16 and bf16: ``storage.stored`` is :func:`qb.quantize_f16` / :func:`qb.quantize_bf16`
    read back, on ties and beyond the f16 range (inf) and float32 subnormals."""
    truth = qb.decode(QUANTIZERS[name](ROWS), name, ROWS.size)
    assert_same_bits(storage.stored(ROWS, name), truth, f"stored {name}")
    if name == "f16":
        assert np.isposinf(truth.reshape(ROWS.shape)[_row_of("value_1e5"), 0])


#: What ggml stores for the row ``value_1e9`` (1e9, then 255 normal values), per type: the
#: counts of +inf, -inf and NaN among the 256 values read back; all are in the first block.
#: An f16 scale of ``1e9 / levels`` is inf, and ggml keeps it: a value quantized to 0 reads back
#: ``0 * inf = NaN``, the others +-inf (iq4_nl's grid has no 0: all inf); in a k-quant the
#: super-block scale is inf and all 256 values are NaN. mxfp4's E8M0 scale reaches 2^127:
#: finite, but 1e9 itself reads back as 805306368 (its scale is ``2^(floor(log2 amax) - 2)``
#: and fp4's largest value 6: amaxes above 1.5 times a power of two are clipped).
BEYOND_F16 = {"q8_0": (1, 0, 31), "q4_0": (1, 0, 31), "q5_0": (1, 0, 31), "q4_1": (1, 0, 31),
              "q5_1": (1, 0, 31), "iq4_nl": (32, 0, 0), "mxfp4": (0, 0, 0),
              "q2_K": (0, 0, 256), "q3_K": (0, 0, 256), "q4_K": (0, 0, 256), "q5_K": (0, 0, 256),
              "q6_K": (0, 0, 256)}


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_a_scale_beyond_f16_reads_back_as_ggml_gives_it(ggml, name):
    """No clamping, no silent repair: a value whose block scale overflows f16 gives exactly the
    infs and NaNs of :data:`BEYOND_F16` in ``storage.stored``, all within the value's own block
    (the other blocks of the row stay finite), and ``decode`` agrees bit for bit. And a single
    -1e5 (beyond f16, a min-based type's min) makes q4_1's and q5_1's whole block -inf, where
    +1e5 (the scale fits) stays finite in every type."""
    assert set(BEYOND_F16) == set(BLOCK_TYPES)
    row = EDGE_ROWS["value_1e9"][None]
    got = storage.stored(row, name)[0]
    counts = (int(np.isposinf(got).sum()), int(np.isneginf(got).sum()), int(np.isnan(got).sum()))
    assert counts == BEYOND_F16[name]
    block = qb.BLOCK_VALUES[name]
    assert np.isfinite(got[block:]).all()
    assert_same_bits(got, qb.decode(ggml_quantize(ggml, row, name), name, 256), name)
    if name == "mxfp4":
        assert got[0] == 805306368.0
    elif name.endswith("_K"):
        assert np.isnan(got).all()
    else:
        assert np.isposinf(got[0])
    below = storage.stored(EDGE_ROWS["value_-1e5"][None], name)[0]
    if name in ("q4_1", "q5_1"):
        assert np.isneginf(below[:block]).all() and np.isfinite(below[block:]).all()
    else:
        assert np.isfinite(below).all()
    assert np.isfinite(storage.stored(EDGE_ROWS["value_1e5"][None], name)).all()


#: Types that store the row ``amax_1e-6`` (uniform values below 1e-6) as zeros: their scales
#: flush to zero in f16 (q8_0's ``1e-6 / 127``; the k-quants' and iq4_nl's scales of scales),
#: where q4_0's ``1e-6 / 8`` is still an f16 subnormal. Every f16-scaled type stores
#: ``tiny_1e-30`` as zeros; mxfp4 (an E8M0 scale) keeps both.
VANISHING_1E_6 = {"q8_0", "q6_K", "q5_K", "q4_K", "iq4_nl", "q3_K"}


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_small_blocks_vanish_where_the_f16_scale_flushes(name):
    """Which types store small blocks as zeros (:data:`VANISHING_1E_6`): what a port computes
    with ggml's weights, reproduced by ``storage.stored``."""
    small = storage.stored(EDGE_ROWS["amax_1e-6"][None], name)
    assert (not small.any()) == (name in VANISHING_1E_6)
    tiny = storage.stored(EDGE_ROWS["tiny_1e-30"][None], name)
    assert (not tiny.any()) == (name != "mxfp4")


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_reference_quantizers_write_ggml_bytes(ggml, name):
    """The numpy ``quantize_row_*_ref`` (q8_0, q4_0, q4_1, q5_0, q5_1) and the f16/bf16
    rounding write the bytes ``ggml_quantize_chunk`` writes, on every edge row and the random
    ones (among them: zero blocks give q4_0/q5_0 the scale -0.0, max / -8 of max +0.0)."""
    expected = ggml_quantize(ggml, ROWS, name).reshape(len(ROWS), -1)
    mine = QUANTIZERS[name](ROWS).reshape(len(ROWS), -1)
    differ = [case for case, a, b in zip([*EDGE_ROWS, *range(len(ROWS) - len(EDGE_ROWS))],
                                         mine, expected, strict=True) if not np.array_equal(a, b)]
    assert not differ, f"{name}: rows {differ} differ"


def test_weight_and_input_q8_0_round_halves_apart():
    """q8_0 weights (``roundf``: half away from zero) and q8_0 matmul inputs (x86: half to even)
    round the row of exact halves differently: the two quantizers are not interchangeable."""
    row = EDGE_ROWS["halves_q8_0"]
    weight = qb.decode(qb.quantize_q8_0(row), "q8_0", 256)
    data = qb.decode(qb.quantize_q8_0_x86(row), "q8_0", 256)
    assert (row[1], weight[1], data[1]) == (-108.5, -109.0, -108.0)
    assert (row[2], weight[2], data[2]) == (-101.5, -102.0, -102.0)


# --- matmul inputs -------------------------------------------------------------------------------


@pytest.mark.parametrize("input_type", sorted(INPUT_QUANTIZERS))
def test_input_quantizers_write_ggml_cpu_bytes(ggml, input_type):
    """The numpy x86 ``quantize_row_q8_0`` / ``quantize_row_q8_1`` and ``quantize_row_q8_K_ref``
    write the bytes of the CPU backend's ``from_float`` (this machine's build) on every row."""
    expected = ggml_from_float(ggml, ROWS, input_type).reshape(len(ROWS), -1)
    mine = INPUT_QUANTIZERS[input_type](ROWS).reshape(len(ROWS), -1)
    differ = [case for case, a, b in zip([*EDGE_ROWS, *range(len(ROWS) - len(EDGE_ROWS))],
                                         mine, expected, strict=True) if not np.array_equal(a, b)]
    assert not differ, f"{input_type}: rows {differ} differ"


@pytest.mark.parametrize("name", STORAGE_TYPES)
def test_matmul_input_is_the_cpu_rounding(name):
    """``storage.matmul_input(x, t)`` is the numpy rounding of t's ``vec_dot_type`` read back:
    the x86 q8_0 (q8_0, q4_0, q5_0, iq4_nl, mxfp4), q8_1 (q4_1, q5_1) and q8_K (the k-quants)
    quantizers, f16 and bf16 rounding, f32 unchanged."""
    input_type = storage.VEC_DOT_TYPES[name]
    if input_type == "f32":
        truth = ROWS
    else:
        encode = {**INPUT_QUANTIZERS, "f16": qb.quantize_f16, "bf16": qb.quantize_bf16}
        truth = qb.decode(encode[input_type](ROWS), input_type, ROWS.size)
    assert_same_bits(storage.matmul_input(ROWS, name), truth, f"matmul_input {name}")


def test_q8_1_inputs_read_back_as_ggml_cpu_bytes(ggml):
    """For q4_1 and q5_1 weights the input is ggml's own q8_1 bytes (``from_float``) read back
    by :func:`qb.decode`, not only the numpy quantizer's."""
    truth = qb.decode(ggml_from_float(ggml, ROWS, "q8_1"), "q8_1", ROWS.size)
    for name in ("q4_1", "q5_1"):
        assert_same_bits(storage.matmul_input(ROWS, name), truth, f"matmul_input {name}")


def test_q8_k_decodes_as_ggml_dequantize_row_q8_k(ggml):
    """q8_K, whose ``to_float`` is NULL: :func:`qb.decode` of the CPU's bytes is ggml's exported
    ``dequantize_row_q8_K``, bit for bit."""
    raw = ggml_from_float(ggml, ROWS, "q8_K")
    assert_same_bits(qb.decode(raw, "q8_K", ROWS.size), ggml_to_float(ggml, raw, "q8_K",
                                                                      ROWS.size), "q8_K")


def test_q8_1_decodes_as_ggml_dot_product_reads_it(ggml):
    """q8_1, which ggml never converts to floats: value j of a block is what ggml's
    ``vec_dot_q4_1_q8_1`` computes against a q4_1 block of d 1, m 0 and quant 1 at j alone
    (``d_x d_y * sum q_x q_y + m_x s_y``). Values compared as numbers: the dot product's sum
    turns -0.0 into +0.0; s zeroed so ``m_x * s`` adds 0. Blocks of a finite d only: with d
    inf, the dot product's lanes of zero quants give ``inf * 0``, NaN for every j."""
    rows = ROWS[: len(EDGE_ROWS) + 2].reshape(-1, qb.QK)   # every edge block and 2 random rows
    raw = ggml_from_float(ggml, rows, "q8_1")
    finite = np.isfinite(raw.view(qb.LAYOUTS["q8_1"])["d"])
    assert finite.sum() == len(finite) - 1                  # the block of 1e9
    rows, raw = rows[finite], raw.reshape(len(rows), -1)[finite].reshape(-1)
    blocks = raw.view(qb.LAYOUTS["q8_1"]).copy()
    blocks["s"] = 0
    vec_dot = ggml.ggml_get_type_traits_cpu(ggml.GGML_TYPE_Q4_1).contents.vec_dot
    one_hot = np.zeros(qb.QK, dtype=qb.LAYOUTS["q4_1"])
    one_hot["d"] = 1.0
    one_hot["qs"][np.arange(qb.QK), np.arange(qb.QK) % 16] = np.where(np.arange(qb.QK) < 16, 1, 16)
    result = ctypes.c_float()
    read = np.empty((len(blocks), qb.QK), dtype=np.float32)
    for i in range(len(blocks)):
        for j in range(qb.QK):
            vec_dot(qb.QK, ctypes.byref(result), 0, _bytes(one_hot[j:j + 1]), 0,
                    _bytes(blocks[i:i + 1]), 0, 1)
            read[i, j] = result.value
    np.testing.assert_array_equal(read, qb.decode(raw, "q8_1", rows.size).reshape(read.shape))


# --- any bytes ------------------------------------------------------------------------------------

#: Each block type's scale fields: f16 (``ggml_half``) but mxfp4's E8M0 byte.
SCALE_FIELDS = {"q4_0": ("d",), "q4_1": ("d", "m"), "q5_0": ("d",), "q5_1": ("d", "m"),
                "q8_0": ("d",), "iq4_nl": ("d",), "mxfp4": ("e",), "q2_K": ("d", "dmin"),
                "q3_K": ("d",), "q4_K": ("d", "dmin"), "q5_K": ("d", "dmin"), "q6_K": ("d",)}


def _scale_patterns(name: str, rng: np.random.Generator) -> np.ndarray:
    """Bit patterns for a scale field, one per block: all 65536 f16 patterns for a 32-value
    type; for a k-quant (256 values a block) the 4096 with an exponent of 0 or 31 (zeros,
    subnormals, infs, NaNs) and 4096 others; mxfp4's 256 exponents, 64 times each."""
    if name == "mxfp4":
        return np.tile(np.arange(256, dtype=np.uint8), 64)
    every = np.arange(65536, dtype=np.uint16)
    if qb.BLOCK_VALUES[name] == qb.QK:
        return every
    exponent = (every >> 10) & 0x1F
    special = every[(exponent == 0) | (exponent == 31)]
    return np.concatenate([special, rng.choice(every[(exponent != 0) & (exponent != 31)], 4096)])


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_every_scale_decodes_as_ggml(ggml, name):
    """Blocks of random bytes whose scale fields run over every pattern (:func:`_scale_patterns`;
    a second field, q4_1's m or a k-quant's dmin, over the same ones shuffled) decode as ggml's
    ``to_float`` reads them, bit for bit."""
    assert set(SCALE_FIELDS) == set(BLOCK_TYPES)
    rng = np.random.default_rng(7)
    patterns = _scale_patterns(name, rng)
    layout = qb.LAYOUTS[name]
    raw = rng.integers(0, 256, len(patterns) * layout.itemsize, dtype=np.uint8)
    blocks = raw.view(layout)
    for i, field in enumerate(SCALE_FIELDS[name]):
        bits = patterns if i == 0 else rng.permutation(patterns)
        blocks[field] = bits.view(blocks[field].dtype)
    n = len(patterns) * qb.BLOCK_VALUES[name]
    assert_same_bits(qb.decode(raw, name, n), ggml_to_float(ggml, raw, name, n), name)


#: Types whose every byte pattern ggml reads (``to_float``, or q8_K's ``dequantize_row_q8_K``).
DECODED = (*BLOCK_TYPES, "q8_K")


@given(st.data())
def test_decode_is_ggml_on_any_bytes(ggml, data):
    """Random bytes of 1 to 3 blocks of any type (NaN and inf scales, every quant) decode as
    ggml reads them, bit for bit, NaN payloads included."""
    name = data.draw(st.sampled_from(DECODED), label="type")
    blocks = data.draw(st.integers(1, 3), label="blocks")
    size = blocks * qb.LAYOUTS[name].itemsize
    raw = np.frombuffer(data.draw(st.binary(min_size=size, max_size=size)), dtype=np.uint8)
    n = blocks * qb.BLOCK_VALUES[name]
    assert_same_bits(qb.decode(raw, name, n), ggml_to_float(ggml, raw, name, n), name)
