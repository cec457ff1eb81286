"""A synthetic summary.csv of a full sweep: 16 weight types (every storage type and a precision
recipe, ``q4_K+recipe``) x 5 candidates on a hybrid TDT+CTC Parakeet, two cases, the CPU
backend (our port also on Vulkan at two weight types, with its comparison against the CPU).

What it holds, for the tests to check against:

- :data:`BITS`: each weight type's bits per weight; the k-quants' cells fell back on
  :data:`FALLBACKS`.
- enc_out's NMSE against the float32 reference (a quantized cell's ``cost_nmse``, f32's own
  ``nmse``) is :data:`NMSE`; the decode's WER :data:`WER`; ctc_logits' KL :data:`KL`; the
  same in both cases, for every candidate.
- ``port_b`` crashed in ``layer_0`` at q2_K in both cases (:data:`CRASH`): the stages after it
  are missing, with the same reason.
- ``transcribe_cpp``'s decode fails at q3_K (its culprit the decode itself).

:func:`scaled_cells` grows it by its cases, to the size of a cluster's sweep (tests/report/
test_scale.py, benchmarks/report_scale.py), with two other references against the primary.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

from audioparity.compare.cell import COLUMNS
from audioparity.contract.vocabulary import STORAGE_TYPES
from audioparity.report.culprit import CELL, culprits

CANDIDATES = ("audioparity", "transcribe_cpp", "whisper_cpp", "port_a", "port_b")
WEIGHT_TYPES = (*STORAGE_TYPES, "q4_K+recipe")
CASES = ("clip", "heldout")
STAGES = ("mel_features", "layer_0", "layer_0_isolated", "layer_1", "layer_1_isolated",
          "enc_out", "joint_logits", "decode", "ctc_logits")
BITS = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q6_K": 6.5625, "q5_1": 6.0,
        "q5_0": 5.5, "q5_K": 5.5, "q4_1": 5.0, "q4_0": 4.5, "q4_K": 4.5, "iq4_nl": 4.5,
        "mxfp4": 4.25, "q3_K": 3.4375, "q2_K": 2.625, "q4_K+recipe": 4.9}
#: enc_out's NMSE against the float32 reference (its Pareto front worked out in
#: tests/report/test_weight_types.py).
NMSE = {"f32": 1e-14, "f16": 2e-7, "bf16": 5e-5, "q8_0": 1e-5, "q6_K": 4e-5, "q5_1": 3e-4,
        "q5_0": 2e-4, "q5_K": 1e-4, "q4_1": 9e-4, "q4_0": 8e-4, "q4_K": 4e-4, "iq4_nl": 5e-4,
        "mxfp4": 2e-3, "q3_K": 4e-3, "q2_K": 2e-2, "q4_K+recipe": 1.5e-4}
WER = {w: 0.0 for w in WEIGHT_TYPES} | {"q4_0": 0.25, "q4_1": 0.25, "mxfp4": 0.25,
                                        "q3_K": 0.5, "q2_K": 0.75}
KL = {w: NMSE[w] * 10 for w in WEIGHT_TYPES}
FALLBACKS = ("joint.pred [64, 640]: q4_K -> q5_0", "joint.out [64, 99]: q4_K -> q8_0")
CRASH = "exit code -6 (SIGABRT): GGML_ASSERT(ne00 % QK_K == 0) failed"


def _row(candidate: str, backend: str, weight_type: str, case: str, stage: str,
         against: str = "reference") -> dict:
    """One row: its metrics against the float32 reference as the module docstring says."""
    row = dict.fromkeys(COLUMNS, "")
    row.update(family="parakeet_tdt", model="tiny", case=case, candidate=candidate,
               backend=backend, weight_type=weight_type, against=against, stage=stage,
               status="pass", gate=f"{weight_type}/{stage}: nmse<=1")
    costed = weight_type != "f32" and against == "reference"
    prefix = "cost_" if costed else ""
    if stage == "decode":
        row.update(token_match=1.0, wer=0.0)
        row[f"{prefix}wer"] = WER[weight_type]
        row[f"{prefix}token_match"] = 1.0 - WER[weight_type]
    else:
        row.update(nmse=1e-13, cosine=1.0 - 1e-13)
        if stage == "ctc_logits":
            row.update(kl=1e-12)
            row[f"{prefix}kl"] = KL[weight_type]
        if stage == "enc_out":
            row[f"{prefix}nmse"] = NMSE[weight_type]
        elif stage != "joint_logits":  # the reference's own path: no cost
            row[f"{prefix}nmse"] = NMSE[weight_type] / 10
    if candidate == "transcribe_cpp" and weight_type == "q3_K" and stage == "decode":
        row.update(status="fail", wer=0.5, token_match=0.5, reason="wer 0.5 > 0.0")
    if candidate == "port_b" and weight_type == "q2_K":
        for column in (*row.keys(),):
            if column.startswith("cost_") or column in ("nmse", "cosine", "kl", "wer",
                                                        "token_match"):
                row[column] = ""
        later = STAGES.index(stage) > STAGES.index("layer_0")
        row.update(status="missing" if later else "crashed" if stage == "layer_0" else "pass",
                   reason=(f"not computed: the dump crashed in layer_0 ({CRASH})" if later
                           else CRASH if stage == "layer_0" else ""))
        if stage == "mel_features":
            row.update(nmse=1e-13, cosine=1.0 - 1e-13)
    row.update(bits_per_weight=BITS[weight_type], fallbacks=0)
    if weight_type.endswith("_K"):
        row.update(fallbacks=len(FALLBACKS), fallback_tensors="; ".join(FALLBACKS))
    return row


def sweep_rows() -> list[dict]:
    """Every row of the synthetic sweep, with its cell's culprit, in summary order."""
    rows = [_row(c, "cpu", w, case, s) for c in CANDIDATES for case in CASES
            for w in WEIGHT_TYPES for s in STAGES]
    for against in ("reference", "cpu"):
        rows += [_row("audioparity", "vulkan", w, case, s, against) for case in CASES
                 for w in ("f32", "q8_0") for s in STAGES]
    found = culprits(rows)
    for row in rows:
        row["culprit"] = found.get(tuple(row[key] for key in CELL), "")
    return rows


def write_sweep(path: Path) -> Path:
    """:func:`sweep_rows` as summary.csv at ``path``."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(sweep_rows())
    return path


#: The other references of the scaled sweep (:func:`scaled_cells`), against the primary
#: ``nemo``: ``transformers`` parts from it at layer 1 on every third case (a difference
#: declared, ``xfail``, its consequences failing after it).
OTHER_REFERENCES = ("transformers", "nemo-2.4.1")
#: Their stages: the candidates' less the isolated forms, which a reference has none of.
REFERENCE_STAGES = tuple(s for s in STAGES if not s.endswith("_isolated"))
#: The cells of one case of the scaled sweep: every candidate and weight type on the CPU, our
#: port on Vulkan at two against the reference and against the CPU, the other references.
CELLS_PER_CASE = len(CANDIDATES) * len(WEIGHT_TYPES) + 2 * 2 + len(OTHER_REFERENCES)


def _reference_row(reference: str, case: str, stage: str, parted: bool) -> dict:
    row = _row("audioparity", "cpu", "f32", case, stage)
    row.update(candidate=reference, backend="torch", against="nemo", bits_per_weight="",
               fallbacks="", gate=f"default/{stage}: nmse<=1e-08")
    if parted and STAGES.index(stage) >= STAGES.index("layer_1"):
        declared = stage == "layer_1"
        row.update(status="xfail" if declared else "fail", nmse=3e-4,
                   reason=("expected (a planted difference): " if declared else "")
                   + "nmse 0.0003 > 1e-08")
    return row


def scaled_cells(count: int) -> Iterator[list[dict]]:
    """The rows of ``count`` cells of the synthetic sweep grown by its cases (``clip0``,
    ``clip1``, ...; :data:`CELLS_PER_CASE` cells each): per case the cells of
    :func:`sweep_rows` and the :data:`OTHER_REFERENCES` against the primary, as the compare
    writes them (a metric that does not apply is None, no culprit yet)."""
    made = 0
    for index in itertools.count():
        case = f"clip{index}"
        cells = [[_row(c, "cpu", w, case, s) for s in STAGES]
                 for c in CANDIDATES for w in WEIGHT_TYPES]
        cells += [[_row("audioparity", "vulkan", w, case, s, against) for s in STAGES]
                  for against in ("reference", "cpu") for w in ("f32", "q8_0")]
        cells += [[_reference_row(r, case, s, r == "transformers" and index % 3 == 0)
                   for s in REFERENCE_STAGES] for r in OTHER_REFERENCES]
        for cell in cells:
            if made == count:
                return
            made += 1
            yield [{k: None if v == "" and k not in TEXT_COLUMNS else v
                    for k, v in row.items()} for row in cell]


#: The columns a cell row holds as text, empty or not.
TEXT_COLUMNS = ("gate", "reason")


def write_cells(folder: Path, count: int) -> Path:
    """:func:`scaled_cells` as ``count`` cell files under ``folder`` (one per cell, as the
    workflow lays them out, a folder per case) and the list of them, one path a line
    (``cells.txt``, for ``audioparity report summary --cells-from``): the list's path."""
    listed = folder / "cells.txt"
    folder.mkdir(parents=True, exist_ok=True)
    with open(listed, "w") as handle:
        for rows in scaled_cells(count):
            first = rows[0]
            path = folder / first["case"] / "_".join(
                first[k] for k in ("candidate", "backend", "weight_type", "against"))
            path = path.with_suffix(".json")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rows))
            handle.write(f"{path}\n")
    return listed
