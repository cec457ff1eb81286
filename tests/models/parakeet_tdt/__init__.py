"""Tests of the Parakeet family; the helpers run its dumps and weights through
:mod:`audioparity.dumping.driver` with :class:`~audioparity.models.parakeet_tdt.ParakeetTdt`, as the
command line does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from audioparity.models.parakeet_tdt import ParakeetTdt

#: The family the helpers run.
PARAKEET = ParakeetTdt()
#: The ggml side's options at their defaults (the command line's).
GGML_OPTIONS = {"conv_weight_type": "f32", "flash_attention": 0}
#: What computing in chunks (attention's query rows, the subsampling's frames) may change in a
#: float32 row, relative to the largest value of the output: the matmuls sum in another order
#: for another row count (measured: about 1e-7); a wrong window changes a frame by its size.
RELATIVE_BOUND = 2e-6


def assert_rows_equal_within_noise(chunked: np.ndarray, whole: np.ndarray) -> None:
    """``chunked`` equals ``whole`` within :data:`RELATIVE_BOUND` of its largest value."""
    assert chunked.shape == whole.shape
    scale = float(np.abs(whole).max())
    assert float(np.abs(chunked - whole).max()) <= RELATIVE_BOUND * scale


def reference_dump(model: Path, cases: list[tuple[Path, Path]], **kwargs: Any) -> None:
    """:func:`audioparity.dumping.driver.dump_reference` of the family (no family options)."""
    from audioparity.dumping.driver import dump_reference

    dump_reference(PARAKEET, model, cases, options={}, **kwargs)


def ggml_dump(model: Path, audio: Path, output: Path, *, reference_dir: Path,
              weight_type: str = "f32", **options: Any) -> None:
    """:func:`audioparity.dumping.driver.dump_ggml` of the family on the CPU, one thread,
    ``options`` over :data:`GGML_OPTIONS`."""
    from audioparity.dumping.driver import RunSettings, dump_ggml

    dump_ggml(PARAKEET, model, audio, output,
              RunSettings(weight_type, "cpu", {**GGML_OPTIONS, **options}), reference_dir)


def uploaded(runtime: Any, model: Path, weight_type: str = "f32", conv_weight_type: str = "f32"):
    """The model's weights in ``runtime`` as a ggml dump uploads them
    (:func:`audioparity.dumping.driver.upload_weights`)."""
    from audioparity.dumping.driver import RunSettings, upload_weights

    weights, _ = upload_weights(PARAKEET, runtime, model, PARAKEET.config(model),
                                RunSettings(weight_type, runtime.backend_name,
                                            {"conv_weight_type": conv_weight_type}))
    return weights
