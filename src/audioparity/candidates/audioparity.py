"""This project's ggml port (ggml-python), the default candidate of every family: its dump is the
contract itself."""

from __future__ import annotations

from pathlib import Path

from audioparity.candidates import Adapter
from audioparity.families import FamilySpec, registered
from audioparity.vocabulary import BACKENDS, WEIGHT_TYPES

ADAPTER = Adapter(
    name="audioparity",
    title="this project's ggml port (ggml-python)",
    families=tuple(registered()),
    output="dump",
    weight_types=WEIGHT_TYPES,
    backends=BACKENDS,
    family_port=True,
    replays=False,
)


def run(model: Path, case: Path, output: Path, *, spec: FamilySpec, family_options: dict,
        options: dict, weight_type: str, backend: str, threads: int,
        reference: Path, weights_file: Path | None = None
        ) -> list[tuple[list[str], dict[str, str]]]:
    """``audioparity ggml <family> ...`` for one cell, the family's ggml options as flags:
    ``options``, the candidate entry's, are the family's options with the entry's own
    overriding the section's (a candidate ``{name: audioparity-flash, options:
    {flash_attention: 1}}`` is the port with flash attention); ``weights_file``: the model's
    weights converted once (``audioparity weights``), mapped by the dump."""
    flags = [arg for option in spec.options_for("ggml")
             for arg in option.argv(options[option.name])]
    reference_args = ["--reference-dir", str(reference)] if spec.ggml_reads_reference else []
    return [(["audioparity", "ggml", spec.command, "--model", str(model), spec.input_flag,
            str(case), *reference_args, "--output-dir", str(output), "--weight-type",
            weight_type, "--backend", backend, "--threads", str(threads), *flags,
            *(["--weights-file", str(weights_file)] if weights_file else [])], {})]
