"""audioparity: parity checks between ggml ports of audio models and their PyTorch/NeMo
references."""

__version__ = "0.1.0"
