"""Model families: one sub-package per family (reference side, ggml port, tiny fixture)."""
