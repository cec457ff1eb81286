"""This project's ggml port, the default candidate of every family: ``candidate run`` dumps its
cells through :func:`audioparity.dumping.driver.dump_ggml`, the dump contract itself; it runs
several cases in one process too (:func:`audioparity.dumping.driver.dump_ggml_cases`)."""

from __future__ import annotations

from audioparity.candidates.adapter import EVERY_FAMILY, Adapter
from audioparity.contract.vocabulary import BACKENDS, WEIGHT_TYPES


class Audioparity(Adapter):
    """Its options are the family's options, the entry's own overriding the section's (a
    candidate ``{name: audioparity-flash, options: {flash_attention: 1}}`` is the port with
    flash attention)."""

    name = "audioparity"
    families = EVERY_FAMILY
    title = "this project's ggml port (ggml-python)"
    output = "dump"
    weight_types = WEIGHT_TYPES
    backends = BACKENDS
    family_port = True
    several_cases = True
    replays = False
