"""The ggml import and its ctypes plumbing, once for the package: ggml-python 0.0.45's
mis-declared pointer returns fixed, numpy shapes as ggml ``ne`` and back, a tensor's bytes and
values read from its backend.

Layout convention: ggml's ``ne`` is the numpy shape reversed. An array of numpy shape ``[T, D]``
(time-major, as in NeMo) becomes a ggml tensor with ``ne = [D, T]`` (``ne[0]`` is the contiguous,
fastest axis). Every public function of the package takes and returns numpy-order shapes.

A failed ggml assert aborts the process (``GGML_NO_BACKTRACE=1`` is set before the import to
keep the message short).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import STORAGE_TYPES as STORAGE_NAMES

os.environ.setdefault("GGML_NO_BACKTRACE", "1")

import ggml  # noqa: E402  (after GGML_NO_BACKTRACE)

#: Storage type name -> ggml type (the names of
#: :data:`audioparity.contract.vocabulary.STORAGE_TYPES`).
STORAGE_TYPES = {name: getattr(ggml, f"GGML_TYPE_{name.upper()}") for name in STORAGE_NAMES}


def _fix_bindings() -> None:
    """Give the six pointer-returning functions mis-declared in ggml-python 0.0.45 a pointer
    return type (they truncate the 64-bit pointer to an int otherwise)."""
    for name in (
        "ggml_backend_cpu_buffer_type",
        "ggml_backend_alloc_buffer",
        "ggml_backend_cpu_buffer_from_ptr",
        "ggml_backend_sched_get_tensor_backend",
        "ggml_backend_vk_buffer_type",
        "ggml_backend_vk_host_buffer_type",
    ):
        func = getattr(ggml, name, None)
        if isinstance(func, ctypes._CFuncPtr):
            func.restype = ctypes.c_void_p


_fix_bindings()


def _ptr(array: np.ndarray) -> ctypes.c_void_p:
    return array.ctypes.data_as(ctypes.c_void_p)


def _ne(shape: tuple[int, ...]) -> ctypes.Array:
    """ggml ``ne`` (reversed numpy shape) as the int64[4] array ggml_new_tensor takes."""
    if not 1 <= len(shape) <= 4:
        raise AudioparityError(f"ggml tensors have 1 to 4 dimensions, got shape {shape}")
    return (ctypes.c_int64 * 4)(*reversed(shape), *([1] * (4 - len(shape))))


def _numpy_shape(tensor, ndim: int | None = None) -> tuple[int, ...]:
    """Numpy-order shape of a ggml tensor (``ne`` reversed), with ``ndim`` axes (default: the
    tensor's ggml_n_dims, which drops trailing size-1 ``ne`` axes)."""
    n = ggml.ggml_n_dims(tensor) if ndim is None else ndim
    ne = tensor.contents.ne
    if any(ne[i] != 1 for i in range(n, 4)):
        raise AudioparityError(
            f"tensor {tensor_name(tensor)!r} has ne {list(ne)}; cannot be read as {n} dims"
        )
    return tuple(int(ne[i]) for i in reversed(range(n)))


def tensor_name(tensor) -> str:
    """The ggml name of a tensor (as set by :class:`Weights`, :meth:`Graph.input`, ...)."""
    return ggml.ggml_get_name(tensor).decode()


def numpy_shape(tensor) -> tuple[int, ...]:
    """Numpy-order shape of a ggml tensor (``ne`` reversed, trailing size-1 ``ne`` dropped)."""
    return _numpy_shape(tensor)


def address(pointer) -> int | None:
    """The address a ctypes pointer (a ggml tensor) holds, None for NULL: an element read from
    a ctypes array aliases the array's slot, so a later write to the slot would change it."""
    return ctypes.cast(pointer, ctypes.c_void_p).value


def tensor_bytes(tensor) -> np.ndarray:
    """The bytes of a contiguous tensor, read back from its backend (``ggml_nbytes`` of them)."""
    raw = np.empty(ggml.ggml_nbytes(tensor), dtype=np.uint8)
    ggml.ggml_backend_tensor_get(tensor, _ptr(raw), 0, raw.nbytes)
    return raw


def tensor_values(tensor) -> np.ndarray:
    """A contiguous tensor's values, flat: float32 dequantized by ggml's own ``to_float`` (f16,
    bf16, q8_0), int32 as they are."""
    raw = tensor_bytes(tensor)
    type_ = tensor.contents.type
    if type_ in (ggml.GGML_TYPE_F32, ggml.GGML_TYPE_I32):
        return raw.view(np.float32 if type_ == ggml.GGML_TYPE_F32 else np.int32)
    out = np.empty(int(np.prod([int(n) for n in tensor.contents.ne])), dtype=np.float32)
    traits = ggml.ggml_get_type_traits(type_).contents
    traits.to_float(_ptr(raw), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size)
    return out
