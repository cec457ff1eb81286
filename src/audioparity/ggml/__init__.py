"""The ggml runtime layer: backends, weights, graphs (see :mod:`audioparity.ggml.runtime`)."""

from audioparity.ggml.runtime import (
    BACKENDS,
    STORAGE_TYPES,
    BackendUnavailable,
    Graph,
    MissingWeight,
    Runtime,
    State,
    Weights,
    doctor,
    numpy_shape,
    storage_supported,
    tensor_name,
)

__all__ = [
    "BACKENDS",
    "STORAGE_TYPES",
    "BackendUnavailable",
    "Graph",
    "MissingWeight",
    "Runtime",
    "State",
    "Weights",
    "doctor",
    "numpy_shape",
    "storage_supported",
    "tensor_name",
]
