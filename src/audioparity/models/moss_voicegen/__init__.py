"""MOSS-VoiceGenerator (``MossTTSDelayModel``, OpenMOSS): tiny fixture, PyTorch reference dump,
our text processor, and the ggml backbone port with its dump."""
