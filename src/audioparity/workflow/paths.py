"""The results-path scheme of the workflow, defined once: each rule's output pattern (Snakemake
wildcards in braces) and the concrete paths the input functions ask for. Paths are relative to
the working directory of the run.

A cell is one comparison: ``<family>/<model>/<candidate>/<backend>/<weight type>/<case>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from audioparity.dumping.emulation import EMULATED_SEPARATOR

RESULTS = "results"
#: The key of one cell, in the order of its folders.
CELL_KEYS = ("family", "model", "candidate", "backend", "weight_type", "case")
CELL = "/".join(f"{{{key}}}" for key in CELL_KEYS)

#: A fixture's directory (rule fixture_build); the model lies inside, where the spec says.
FIXTURE = f"{RESULTS}/fixtures/{{family}}/{{name}}"
#: The reference job's directory of one model (checkpoint reference_dump): one dump per case,
#: ``<case>@<weight type>`` for its quantization-aware ones, ``<dump>.sha256`` beside each.
REFERENCE = f"{RESULTS}/reference/{{family}}/{{model}}"
#: Another reference of a model (config ``references``, after the primary; rule
#: reference_other): one dump per case.
OTHER_REFERENCE = f"{RESULTS}/references/{{family}}/{{model}}/{{reference}}"
#: What the reference job of a model dumps (its cases and emulated types), written when the
#: workflow is parsed, rewritten only when it changes.
REFERENCE_PLAN = f"{REFERENCE}.plan.json"
#: The content digests of the cases' files, by their size and time (:mod:`.digests`).
INPUT_DIGESTS = f"{RESULTS}/cache/inputs.json"
#: Where the reference job keeps each dump by a key of its code and inputs.
REFERENCE_CACHE = f"{RESULTS}/cache/reference/{{family}}/{{model}}"
#: A candidate's own model files, per weight type (rule candidate_model).
CANDIDATE_MODEL = f"{RESULTS}/candidates/{{family}}/{{model}}/{{candidate}}/{{weight_type}}"
#: The storage-matched reference of a third-party port's quantized cells (rule
#: reference_storage): one dump per case, computed with the weights its model file stores.
REFERENCE_STORAGE = (f"{RESULTS}/reference_storage/{{family}}/{{model}}/{{candidate}}/"
                     "{weight_type}")
#: Where the storage-matched reference keeps each dump, a folder per storage file's digest:
#: cells of another candidate that stores the same bytes restore them.
REFERENCE_STORAGE_CACHE = f"{RESULTS}/cache/reference_storage/{{family}}/{{model}}"
#: The model's weights converted once per weight type for our port (rule ggml_weights).
WEIGHTS = f"{RESULTS}/weights/{{family}}/{{model}}/{{candidate}}/{{weight_type}}.gguf"
#: A precision recipe of a model, searched for on the sweep's cases (rule precision); the
#: weight type is the recipe's ``<type>+<name>``.
PRECISION = f"{RESULTS}/precision/{{family}}/{{model}}/{{weight_type}}.json"
#: A candidate's dump of one cell (rule ggml_dump).
GGML = f"{RESULTS}/ggml/{CELL}"
#: The reference's replay of a candidate's cell (rule reference_replay).
REPLAY = f"{RESULTS}/replay/{CELL}"
#: One cell compared with the reference (rule compare_cell).
COMPARE = f"{RESULTS}/compare/{CELL}.json"
#: Another reference's dump of a case compared with the primary's (rule compare_reference).
COMPARE_REFERENCE = f"{RESULTS}/compare_references/{{family}}/{{model}}/{{reference}}/{{case}}.json"
#: One cell compared with the baseline backend (rule compare_backend).
COMPARE_BACKEND = f"{RESULTS}/compare_backends/{CELL}.json"
#: A candidate's cases run again in one process, each against its fresh dump (rule
#: compare_fresh): a folder of ``<case>.json``, one per case, and ``runs/`` (those that differ).
COMPARE_FRESH = (f"{RESULTS}/compare_fresh/{{family}}/{{model}}/{{candidate}}/{{backend}}/"
                 "{weight_type}")
#: The drill-down of a cell against the baseline backend: its rows, and its folder.
DRILLDOWN = f"{RESULTS}/drilldown/{CELL}.json"
DRILLDOWN_FOLDER = f"{RESULTS}/drilldown/{CELL}"
#: The digest of the source files a kind of job runs (:mod:`audioparity.workflow.code`),
#: rewritten only when one of them changes.
CODE = f"{RESULTS}/code/{{name}}.sha256"
#: What each source file imports, by the digest of its content (parsed once, not every run).
IMPORTS = f"{RESULTS}/code/imports.json"
#: The report: the list of the sweep's cell files (one a line), the summary and the HTML page.
REPORT_CELLS = f"{RESULTS}/report/cells.txt"
SUMMARY = f"{RESULTS}/report/summary.csv"
HTML = f"{RESULTS}/report/index.html"


def log(rule: str, key: str) -> str:
    """A rule's log file for the job named by ``key`` (a pattern: ``CELL``)."""
    return f"logs/{rule}/{key}.log"


def benchmark(rule: str, key: str) -> str:
    """A rule's benchmark file (Snakemake's) for the job named by ``key``."""
    return f"{RESULTS}/benchmarks/{rule}/{key}.tsv"


def fill(pattern: str, values: Mapping[str, Any] | Any, **override: str) -> str:
    """``pattern`` with its wildcards taken from ``values`` (a mapping, or an object with them
    as attributes: Snakemake's wildcards), ``override`` first."""
    get = values.get if isinstance(values, Mapping) else lambda key: getattr(values, key)
    keys = {key for key in CELL_KEYS + ("name",) if f"{{{key}}}" in pattern}
    return pattern.format(**{key: override[key] if key in override else get(key)
                             for key in keys})


def reference_dump(family: str, model: str, case: str, emulated: str | None = None) -> str:
    """The reference dump of a case: the float32 one, or with ``emulated`` its
    quantization-aware one (``<case>@<weight type>``)."""
    dump = f"{REFERENCE.format(family=family, model=model)}/{case}"
    return f"{dump}{EMULATED_SEPARATOR}{emulated}" if emulated else dump


def digest(dump: str) -> str:
    """The content digest written beside a dump (``audioparity digest``)."""
    return f"{dump}.sha256"
