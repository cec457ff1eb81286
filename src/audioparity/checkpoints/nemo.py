"""A NeMo ``.nemo`` file: a tar holding ``model_config.yaml``, ``model_weights.ckpt`` (a
:mod:`~audioparity.checkpoints.torch_zip` state dict) and the tokenizer files."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path
from typing import BinaryIO

from audioparity.errors import AudioparityError


def copy_nemo_member(path: Path, suffix: str, out: BinaryIO) -> None:
    """Stream the one member of the ``.nemo`` tar at ``path`` whose name ends ``suffix`` into
    ``out`` (a binary file object).

    Raises:
        AudioparityError: not a tar file, or no such member.
    """
    try:
        tar = tarfile.open(path, "r:*")
    except tarfile.ReadError:
        raise AudioparityError(
            f"{path}: not a tar archive; a .nemo is a tar holding model_config.yaml and "
            "model_weights.ckpt"
        ) from None
    except OSError as err:
        raise AudioparityError(f"{path}: cannot read the .nemo ({err.strerror or err})") from None
    try:
        with tar:
            for member in tar:
                if member.isfile() and Path(member.name).name.endswith(suffix):
                    shutil.copyfileobj(tar.extractfile(member), out, 1 << 24)
                    return
    except (tarfile.TarError, OSError, EOFError) as err:
        raise AudioparityError(
            f"{path}: truncated or corrupt .nemo archive ({str(err).splitlines()[0]}) while "
            f"looking for {suffix}"
        ) from None
    raise AudioparityError(f"{path}: no {suffix} inside the .nemo archive")


def read_nemo_member(path: Path, suffix: str) -> bytes:
    """The bytes of the one member of the ``.nemo`` tar at ``path`` whose name ends ``suffix``.

    Raises:
        AudioparityError: not a tar file, or no such member.
    """
    buffer = io.BytesIO()
    copy_nemo_member(path, suffix, buffer)
    return buffer.getvalue()
