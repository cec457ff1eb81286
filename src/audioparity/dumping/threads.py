"""The torch intra-op thread count of a reference job: set for the job, restored after (a test
or a notebook that calls a reference entry point keeps its own)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(threads)`` (results are bit-stable at a fixed
    count); the previous count is restored on leaving. Imports torch."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
