"""Candidates: implementations judged against the reference. An adapter (:class:`Adapter`, a
subclass per kind of candidate) says how to build, feed, run and read one kind; a candidate is
a config entry naming an adapter (a shipped one, a ``.py`` file of the user's, or an entry
point: :func:`load_adapter`) and its options (docs/candidates.md)."""

from audioparity.candidates.adapter import (
    OUTPUTS,
    VULKAN_MARK,
    Adapter,
    Command,
    Port,
    TensorMap,
    ToolCall,
    WeightName,
    ggml_flags,
)
from audioparity.candidates.registry import ENTRY_POINTS, check_adapter, load_adapter, registered

__all__ = ["ENTRY_POINTS", "OUTPUTS", "VULKAN_MARK", "Adapter", "Command", "Port", "TensorMap",
           "ToolCall", "WeightName", "check_adapter", "ggml_flags", "load_adapter", "registered"]
