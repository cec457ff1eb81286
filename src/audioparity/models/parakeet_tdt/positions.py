"""NeMo's relative positional encodings as numpy, for both sides: the tables
(``RelPositionalEncoding``, ``LocalAttRelPositionalEncoding``: :func:`rel_pos_encoding`,
:func:`local_rel_pos_encoding`, of NeMo's sinusoids), a local window's positions on the full grid
and its band mask, and the rows of a padded batch's table that hold the valid frames
(:func:`valid_positions`). Importing this module imports neither torch nor ggml.
"""

from __future__ import annotations

import math

import numpy as np

from audioparity.contract.errors import AudioparityError

#: NeMo's ``INF_VAL`` base of the sinusoidal positional encoding.
POSITION_BASE = 10000.0


def rel_pos_encoding(n_frames: int, d_model: int) -> np.ndarray:
    """``RelPositionalEncoding`` embedding for ``n_frames`` frames, computed on the host.

    Rows are positions ``T-1, T-2, ..., -(T-1)`` (:func:`sinusoids`).

    Returns:
        ``[2T-1, D]`` float32.
    """
    return sinusoids(np.arange(n_frames - 1, -n_frames, -1, dtype=np.float32), d_model)


def local_rel_pos_encoding(context: int, d_model: int) -> np.ndarray:
    """``LocalAttRelPositionalEncoding`` embedding of a ``[w, w]`` window (``context`` = w),
    computed on the host: rows are positions ``w, w-1, ..., -w`` (:func:`sinusoids`), whatever
    the number of frames.

    Returns:
        ``[2w+1, D]`` float32.
    """
    return sinusoids(np.arange(context, -context - 1, -1, dtype=np.float32), d_model)


def sinusoids(positions: np.ndarray, d_model: int) -> np.ndarray:
    """NeMo's ``PositionalEncoding.create_pe`` of float32 ``positions`` ``[P]``.

    Column ``2i`` is ``sin(pos * div_i)`` and
    ``2i+1`` is ``cos(pos * div_i)`` with ``div_i = exp(2i * -(ln 10000 / D))``, following
    NeMo's float32 ``create_pe``: the exponent and the angle ``pos * div_i`` are rounded to
    float32 as torch rounds them, and exp, sin and cos are evaluated in float64 and rounded
    once (correctly rounded). This matches NeMo to one float32 ulp, except in the few columns
    where torch's float32 ``exp`` is not correctly rounded (7 of 512 at D=1024): there the angle
    differs by one ulp of ``pos * div_i`` (about 2.4e-4 at position 3000).

    Returns:
        ``[P, D]`` float32.
    """
    positions = np.asarray(positions, dtype=np.float32)[:, None]
    exponent = np.arange(0, d_model, 2, dtype=np.float32) * np.float32(
        -(math.log(POSITION_BASE) / d_model))
    div_term = np.exp(exponent.astype(np.float64)).astype(np.float32)
    angles = (positions * div_term).astype(np.float64)
    pe = np.zeros((positions.shape[0], d_model), dtype=np.float32)
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


def local_positions_on_full_grid(pos_emb: np.ndarray, n_frames: int) -> np.ndarray:
    """A local window's positional encoding ``[2w+1, D]`` (positions ``w ... -w``) placed on
    the full grid of :func:`rel_pos_encoding`, ``[2T-1, D]`` (positions ``T-1 ... -(T-1)``),
    zero at the positions outside the window (those beyond ``T-1`` dropped).

    ``linear_pos`` has no bias in NeMo, so a zero row gives a zero positional score: with
    :func:`band_mask`, :func:`rel_pos_attention` on this grid computes what
    ``RelPositionMultiHeadAttentionLongformer`` computes on its diagonals.
    """
    context = (pos_emb.shape[0] - 1) // 2
    grid = np.zeros((2 * n_frames - 1, pos_emb.shape[1]), dtype=np.float32)
    span = min(context, n_frames - 1)
    # grid row r is position T-1-r; window row c is position w-c
    grid[n_frames - 1 - span : n_frames + span] = pos_emb[context - span : context + span + 1]
    return grid


def band_mask(n_frames: int, context: int) -> np.ndarray:
    """The additive attention mask of a ``[w, w]`` window: ``[T_q, T_k]`` float32, 0 where
    ``|i - j| <= w`` and ``-inf`` elsewhere.

    NeMo's ``RelPositionMultiHeadAttentionLongformer`` scores only the keys ``i-w .. i+w``
    (``sliding_chunks_matmul_qk``), sets the keys before the first frame to ``-inf``
    (``mask_invalid_locations``) and those past the last (its padding to a multiple of
    ``2w``) to ``-INF_VAL`` (-10000); both give a softmax weight of exactly 0 in float32, as
    ``-inf`` does here.
    """
    offset = np.arange(n_frames)[:, None] - np.arange(n_frames)[None, :]
    return np.where(np.abs(offset) <= context, 0.0, -np.inf).astype(np.float32)


def valid_positions(pos_emb: np.ndarray, n_frames: int) -> np.ndarray:
    """The rows of ``pos_emb`` for the valid frames: positions ``T'-1 ... -(T'-1)``.

    NeMo sizes ``pos_emb`` by the padded length P of the batch (``[2P-1, D]``, rows ``P-1 ...
    -(P-1)``), and P can exceed the valid length T' by one: the preprocessor returns L//160 + 1
    frames of which L//160 are valid, so when L//160 is a multiple of 8 the padded frame
    survives the x8 subsampling (e.g. exactly 10.0 s: T' 125, P 126). The padded frame is masked
    in attention, so the valid rows are the middle ``2T'-1``.

    Raises:
        AudioparityError: ``pos_emb`` has an even row count or fewer than ``2T'-1`` rows.
    """
    rows = pos_emb.shape[0]
    if rows % 2 == 0 or rows < 2 * n_frames - 1:
        raise AudioparityError(
            f"pos_emb: shape {list(pos_emb.shape)}, expected [2P-1, D] with P >= T'={n_frames}"
        )
    start = (rows + 1) // 2 - n_frames
    return pos_emb[start : start + 2 * n_frames - 1]
