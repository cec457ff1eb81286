"""The ggml runtime layer: backends, weights, graphs (see :mod:`audioparity.ggml.runtime`).

The package exports exactly :data:`audioparity.ggml.runtime.__all__`, the one list of its names.
"""

from audioparity.ggml import runtime
from audioparity.ggml.runtime import *  # noqa: F403  (the names of runtime.__all__)

__all__ = runtime.__all__
