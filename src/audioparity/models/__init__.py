"""Model families, one package each: its spec (``SPEC`` in the package's ``__init__``), its tiny
fixture, its reference dump and its ggml port (:mod:`audioparity.families` finds them)."""
