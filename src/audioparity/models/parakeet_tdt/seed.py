"""The Parakeet seed tool's ``--nemo-dir`` files, from a reference dump of ours
(``audioparity export --format seed``; the ``parakeet_dump_cpp`` adapter's ``prepare``).

The seed (audio.cpp's ``dump_cpp_reference``, ``../shared/seeds``) reads NeMo's captures
with their batch axis: ``pre_encode.npy`` ``[1, T, D]`` and ``pos_emb.npy`` ``[1, 2T-1, D]``
(rank 3, or it refuses them), for its isolated layer 0; and ``--decoder-input`` takes an encoder
output ``[T, D]`` (rank 2), here ``enc_out.npy``. All little-endian float32, C order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump
from audioparity.models.parakeet_tdt.spec import Names

#: The files :func:`write_seed` writes.
FILES = ("pre_encode.npy", "pos_emb.npy", "enc_out.npy")


def seed_inputs(dump: Dump) -> dict[str, np.ndarray]:
    """The seed's files of ``dump`` by file name (module docstring): ``pre_encode`` and
    ``pos_emb`` with a leading batch axis of 1, ``enc_out`` as it is, all float32.

    Raises:
        AudioparityError: the dump lacks ``pre_encode``, ``pos_emb`` or ``enc_out``, or their
            shapes are not ``[T, D]``, ``[2T-1, D]``, ``[T, D]`` of one ``T`` and ``D``.
    """
    stages = (Names.PRE_ENCODE, Names.POS_EMB, Names.ENC_OUT)
    missing = [name for name in stages if not dump.has(name)]
    if missing:
        raise AudioparityError(f"{dump.path}: no {', '.join(missing)}; the Parakeet seed "
                               "format needs pre_encode, pos_emb and enc_out")
    pre_encode, pos_emb, enc_out = (dump.tensor(name) for name in stages)
    if pre_encode.ndim != 2 or pre_encode.shape[0] < 1:
        raise AudioparityError(f"{dump.path}: pre_encode is {list(pre_encode.shape)}; "
                               "expected [T, D]")
    frames, width = pre_encode.shape
    for name, array, shape in ((Names.POS_EMB, pos_emb, (2 * frames - 1, width)),
                               (Names.ENC_OUT, enc_out, (frames, width))):
        if array.shape != shape:
            raise AudioparityError(f"{dump.path}: {name} is {list(array.shape)}; expected "
                                   f"{list(shape)} for pre_encode {list(pre_encode.shape)}")
    return {"pre_encode.npy": pre_encode[None], "pos_emb.npy": pos_emb[None],
            "enc_out.npy": enc_out}


def write_seed(dump: Dump, folder: Path) -> list[str]:
    """Write :func:`seed_inputs` of ``dump`` into ``folder`` (an existing folder); the file
    names written.

    Raises:
        AudioparityError: as :func:`seed_inputs`, before anything is written.
    """
    files = seed_inputs(dump)
    for name, array in files.items():
        np.save(Path(folder) / name, np.ascontiguousarray(array, dtype="<f4"),
                allow_pickle=False)
    return list(files)
