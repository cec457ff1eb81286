"""A NeMo ``.nemo`` file: a tar holding ``model_config.yaml``, ``model_weights.ckpt`` (a
:mod:`~audioparity.checkpoints.torch_zip` state dict) and the tokenizer files."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path
from typing import BinaryIO

from audioparity.contract.errors import AudioparityError


class FileWindow(io.RawIOBase):
    """Bytes ``offset .. offset + size`` of the file at ``path`` as a read-only, seekable file
    (a member of an uncompressed tar, read in place: :func:`nemo_member_span`)."""

    def __init__(self, path: Path, offset: int, size: int) -> None:
        self._file = open(path, "rb")  # noqa: SIM115  (closed with the window)
        self._offset, self._size, self._position = offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, position: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + position)
        return self._position

    def readinto(self, buffer) -> int:
        n = max(0, min(len(buffer), self._size - self._position))
        self._file.seek(self._offset + self._position)
        got = self._file.readinto(memoryview(buffer)[:n])
        self._position += got
        return got

    def close(self) -> None:
        self._file.close()
        super().close()


def nemo_member_span(path: Path, suffix: str) -> tuple[int, int] | None:
    """``(offset, size)`` in the file of the one member of the ``.nemo`` tar at ``path`` whose
    name ends ``suffix``, or None when the tar is compressed (its members are not in the file
    as they are; :func:`copy_nemo_member` extracts them).

    Raises:
        AudioparityError: not a tar file, or no such member.
    """
    if _compressed(path):
        return None
    found: list[tuple[int, int]] = []
    _find_member(path, suffix, lambda _, member: found.append((member.offset_data, member.size)))
    offset, size = found[0]
    if offset + size > path.stat().st_size:
        raise AudioparityError(f"{path}: truncated or corrupt .nemo archive ({suffix} ends "
                               f"past the end of the file) while looking for {suffix}")
    return offset, size


def _compressed(path: Path) -> bool:
    """Whether the file starts like gzip, bzip2 or xz (a compressed tar)."""
    with open(path, "rb") as handle:
        head = handle.read(6)
    return head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ"))


def copy_nemo_member(path: Path, suffix: str, out: BinaryIO) -> None:
    """Stream the one member of the ``.nemo`` tar at ``path`` whose name ends ``suffix`` into
    ``out`` (a binary file object).

    Raises:
        AudioparityError: not a tar file, or no such member.
    """
    _find_member(path, suffix, lambda tar, member: shutil.copyfileobj(
        tar.extractfile(member), out, 1 << 24))


def _find_member(path: Path, suffix: str, use) -> None:
    """Call ``use(tar, member)`` on the one member of the ``.nemo`` tar at ``path`` whose
    name ends ``suffix``.

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
                    use(tar, member)
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
