"""A config's gate lists (module docstring of :mod:`.gates`: entries, expected failures, the
rules that move bounds, the unmeasured lists): each entry checked (:func:`check_resolved`) and the
lists of one cell resolved in order (:func:`resolve_gates`); :mod:`.gates` judges a stage by
them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from audioparity.compare.gates import (
    NUMERIC,
    PATTERNS,
    THRESHOLDS,
    UNMEASURED,
    UNMEASURED_GATES,
    gate_text,
    unmeasured_mark,
)
from audioparity.compare.plan import REFERENCE, CellKey
from audioparity.compare.scaling import CARRIED_NOISE, LENGTH_SCALING, check_rule
from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import (
    BACKENDS,
    BLOCK_TYPES,
    MIXES,
    QUANTIZED,
    RECIPE_SEPARATOR,
)


def _entry_error(where: str, message: str) -> AudioparityError:
    return AudioparityError(f"gates: {where}: {message}")


def _check_gate(entry: Any, where: str, extra: tuple[str, ...]) -> None:
    """Raise unless ``entry`` is a gate entry: ``stage``, thresholds, and the ``extra`` keys."""
    if not isinstance(entry, Mapping):
        raise _entry_error(where, f"expected a mapping, got {entry!r}")
    if not isinstance(entry.get("stage"), str) or not entry["stage"]:
        raise _entry_error(where, f"needs a 'stage' pattern, got {entry!r}")
    unknown = sorted(set(entry) - {"stage", *THRESHOLDS, *extra})
    if unknown:
        raise _entry_error(
            where, f"unknown key(s) {', '.join(unknown)}; thresholds: {', '.join(THRESHOLDS)}"
        )
    for key in NUMERIC:
        value = entry.get(key)
        if key in entry and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
        ):
            raise _entry_error(where, f"{key} must be a number, got {value!r}")
    if "exact" in entry and not isinstance(entry["exact"], bool):
        raise _entry_error(where, f"exact must be true or false, got {entry['exact']!r}")
    if not any(key in entry for key in NUMERIC) and entry.get("exact") is not True:
        raise _entry_error(where, f"stage {entry['stage']!r} sets no threshold")


def _check_expected(entry: Any, where: str, extra: tuple[str, ...]) -> None:
    """Raise unless ``entry`` is an expected failure: ``stage``, ``reason``, ``extra`` patterns."""
    if not isinstance(entry, Mapping):
        raise _entry_error(where, f"expected a mapping, got {entry!r}")
    for key in ("stage", "reason"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise _entry_error(where, f"needs a non-empty {key!r}, got {entry!r}")
    unknown = sorted(set(entry) - {"stage", "reason", "strict", *extra})
    if unknown:
        raise _entry_error(where, f"unknown key(s) {', '.join(unknown)}")
    if not isinstance(entry.get("strict", True), bool):
        raise _entry_error(where, f"strict must be true or false, got {entry['strict']!r}")
    for key in extra:
        if key in entry and not isinstance(entry[key], str):
            raise _entry_error(where, f"{key} must be a pattern string, got {entry[key]!r}")


#: The section's lists of expected failures, read in this order: ``extra_expected_failures``
#: lets a config given after config/config.yaml (``--configfile``; Snakemake replaces a list
#: there, it does not extend it) add its own declarations to the defaults'.
EXPECTED_LISTS = ("expected_failures", "extra_expected_failures")


def resolve_gates(section: Mapping[str, Any], cell: CellKey, *, ggml_backend: str | None = None
                  ) -> dict[str, list[dict[str, Any]]]:
    """The gates of one cell from a config section.

    Args:
        section: a mapping with ``gates`` (weight type or ``default`` -> list of entries) and
            the optional lists of :data:`EXPECTED_LISTS` and :data:`UNMEASURED_GATES`; other
            keys are ignored, so a family's whole config section can be passed.
        cell: the cell (its ``family`` is not read: ``section`` is the family's). Its model,
            backend, weight type, candidate and case (:data:`~.gates.PATTERNS`) choose the
            ``expected_failures`` kept: those whose patterns match them (fnmatch). Its
            ``against`` is what it is compared with: ``reference``, or a backend, whose
            comparison is a diagnosis (the same candidate on the CPU, say) that takes the gates
            and no expected failure: a declaration states why a cell differs from the
            reference.
        ggml_backend: the ggml backend the cell's ``backend`` (a setting's name) runs on;
            default ``backend``.

    Returns:
        ``{"gates": [...], "expected_failures": [...]}``: the entries of
        ``<weight type>@<ggml backend>`` (a backend's own list, where the section has one:
        the quantization-aware references emulate the CPU's rounding, not another backend's;
        looked up by the ggml backend, so every setting of it takes the same lists),
        then for a block type ``quantized@<ggml backend>`` (every block type's), then the
        weight type's, then ``quantized``'s, then ``default``'s, each with ``from`` added; a
        recipe's weight type (``q4_K+recipe``) and a mix (``q4_K_M``) take their base type's
        lists; ``unmeasured`` added to the entries of a list the section's
        ``unmeasured_gates`` names (:func:`unmeasured_lists`); the matching
        expected failures as ``{"stage", "reason"}`` (and ``"strict": false`` where declared).

    Raises:
        AudioparityError: a malformed section (names the list, the entry index and the key).
    """
    gates = section.get("gates")
    if not isinstance(gates, Mapping) or not gates:
        raise AudioparityError("gates: expected a mapping of weight type -> list of entries")
    unmeasured = unmeasured_lists(section)
    resolved = []
    base = cell.weight_type.split(RECIPE_SEPARATOR)[0]
    base = MIXES.get(base, base)
    lists = (base, QUANTIZED) if base in BLOCK_TYPES else (base,)
    for name in (*(f"{n}@{ggml_backend or cell.backend}" for n in lists), *lists, "default"):
        entries = gates.get(name, [])
        if not isinstance(entries, list):
            raise _entry_error(name, f"expected a list of entries, got {entries!r}")
        for i, entry in enumerate(entries):
            _check_gate(entry, f"{name}[{i}]", ())
            resolved.append({**entry, "from": name,
                             **({"unmeasured": unmeasured[name]} if name in unmeasured else {})})
    labels = cell._asdict()
    chosen = []
    for key in EXPECTED_LISTS:
        expected = section.get(key) or []
        if not isinstance(expected, list):
            raise _entry_error(key, f"expected a list, got {expected!r}")
        for i, entry in enumerate(expected):
            _check_expected(entry, f"{key}[{i}]", PATTERNS)
            if cell.against == REFERENCE and all(fnmatchcase(labels[k], entry.get(k, "*"))
                                                 for k in PATTERNS):
                chosen.append({"stage": entry["stage"], "reason": entry["reason"],
                               **({"strict": False} if entry.get("strict") is False else {})})
    result = {"gates": resolved, "expected_failures": chosen}
    for key in _RULES:
        if section.get(key) is not None:
            _check_rule(key, section[key], resolved)
            result[key] = dict(section[key])
    return result


#: The section's rules that move bounds with the case (:mod:`audioparity.compare.scaling`).
_RULES = (LENGTH_SCALING, CARRIED_NOISE)


def _check_rule(key: str, rule: Any, entries: list[Mapping[str, Any]]) -> None:
    """:func:`~audioparity.compare.scaling.check_rule` against the ``default`` list's
    patterns."""
    check_rule(key, rule, [e["stage"] for e in entries if e.get("from") == "default"])


def unmeasured_lists(section: Mapping[str, Any]) -> dict[str, str]:
    """The gate lists of ``section`` its ``unmeasured_gates`` names (module docstring), each with
    its mark, ``unmeasured on <ggml backend>: <why>``.

    Raises:
        AudioparityError: ``unmeasured_gates`` is not a mapping of a backend list's name or
            pattern (``<weight type>@<ggml backend>``) to why, or a pattern names no list of the
            section's ``gates`` (one line, naming it).
    """
    named = section.get(UNMEASURED_GATES) or {}
    if not isinstance(named, Mapping):
        raise AudioparityError(f"{UNMEASURED_GATES}: expected a mapping of gate list -> why, "
                               f"got {named!r}")
    lists = [name for name in section.get("gates") or {} if "@" in name]
    marks: dict[str, str] = {}
    for pattern, why in named.items():
        where = f"{UNMEASURED_GATES} {pattern!r}"
        types, at, backend = (pattern.rpartition("@") if isinstance(pattern, str)
                              else ("", "", ""))
        if not (types and at and backend in BACKENDS):
            raise AudioparityError(f"{where}: name a backend's gate lists, <weight type>@<"
                                   f"{'|'.join(BACKENDS)}> (a pattern: *@cuda)")
        if not isinstance(why, str) or not why.strip():
            raise AudioparityError(f"{where}: say why they are unmeasured, got {why!r}")
        matched = [name for name in lists if fnmatchcase(name, pattern)]
        if not matched:
            raise AudioparityError(f"{where}: names no gate list of the section (its backends' "
                                   f"lists: {', '.join(lists) or 'none'})")
        marks.update({name: f"{UNMEASURED} {backend}: {why.strip()}" for name in matched})
    return marks


def check_resolved(gates: Any) -> None:
    """Raise unless ``gates`` has the form :func:`resolve_gates` returns.

    Raises:
        AudioparityError: names the entry and the key that is wrong.
    """
    if not isinstance(gates, Mapping) or not isinstance(gates.get("gates"), list):
        raise AudioparityError(
            "gates: expected {'gates': [...], 'expected_failures': [...]} as resolve_gates "
            f"returns, got keys {sorted(gates) if isinstance(gates, Mapping) else gates!r}"
        )
    for i, entry in enumerate(gates["gates"]):
        _check_gate(entry, f"gates[{i}]", ("from", "length", "carried", "unmeasured"))
        if "unmeasured" in entry and unmeasured_mark(gate_text(entry)) != entry["unmeasured"]:
            raise _entry_error(f"gates[{i}]", f"unmeasured must read '{UNMEASURED} <backend>: "
                               f"<why>', got {entry['unmeasured']!r}")
    for key in _RULES:
        if gates.get(key) is not None:
            _check_rule(key, gates[key], gates["gates"])
    expected = gates.get("expected_failures", [])
    if not isinstance(expected, list):
        raise _entry_error("expected_failures", f"expected a list, got {expected!r}")
    for i, entry in enumerate(expected):
        _check_expected(entry, f"expected_failures[{i}]", ())
