"""Parakeet's reference implementations: one module per library, each one
:class:`~audioparity.contract.family.ReferenceLibrary`, named by its file (the family's table lists
this
folder: :func:`~audioparity.contract.family.reference_names`)."""
