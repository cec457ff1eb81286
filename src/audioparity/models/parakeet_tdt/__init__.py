"""Parakeet-TDT (NeMo ``EncDecRNNTBPEModel``): tiny fixture, NeMo reference dump and ggml port."""
