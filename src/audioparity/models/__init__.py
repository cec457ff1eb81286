"""Model families, one package each: its ``Family`` class and table in the package's
``__init__``, its tiny fixture, its reference and its ggml port (:mod:`audioparity.models.registry`
lists them)."""
