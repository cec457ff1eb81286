"""Whisper's reference implementations: one module per library, each one
:class:`~audioparity.family.ReferenceLibrary`, named by its file (the family's table lists this
folder: :func:`~audioparity.family.reference_names`)."""
