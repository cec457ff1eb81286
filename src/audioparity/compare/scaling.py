"""Rules that move a cell's float32 bounds with what its case does to float32 noise: the case's
length (``length_scaling``) and the error an upstream stage carries into the stages after it
(``carried_noise``). Both are optional keys of a family's config section; :func:`check_rule`
reads them, :func:`for_length` and :func:`carry_noise` apply them to resolved gates
(:func:`audioparity.compare.gate_lists.resolve_gates`).

Length scaling: float32 noise that grows with a clip's length (sums over every frame, positions
past the table's) moves the f32 bounds of the stages it reaches; the rule scales them by the
case's length::

    length_scaling:
      frames_of: mel_features    # the stage whose first axis is the case's length, in the reference
      entries:                   # `default` entries, by their stage pattern: the length the bounds
        mel_features: {measured_at: 6000, nmse_max: 2, max_rel_max: 0.5}  # hold up to, and the
                                                                           # exponent of each
        pos_emb: {frames_of: pos_emb, measured_at: 275, nmse_max: 1.25}   # its own rows

A case whose ``frames_of`` stage (an entry's own, else the rule's) has ``T`` rows,
``T > measured_at``, takes each named threshold times ``(T / measured_at) ** exponent`` (rounded
up to two significant digits), and the gate column says so. Shorter cases take the bounds as
written. An entry's own ``frames_of`` measures a noise that grows with another axis than the
case's (a position table's rows, which a model's subsampling sets).

Carried noise: on band-limited audio the top mel bins are near-constant, their normalisation
amplifies float32 noise 1e5-fold, and every stage after the mel carries that error, the
reference's own as much as any float32 port's. A reference that sees it records its own noise
on the case in its manifest (``noise_floor``: each end-to-end stage of its float32 run against
the same stage on a more exact mel; :mod:`audioparity.models.parakeet_tdt.floor`). Where the
rule's ``from`` stage passes on its spread measures (its reference has near-constant features,
``spread_nmse_max``), the bounds of each stage the floor names rise to a gain times the floor::

    carried_noise: {from: mel_features, gain: 10}

A bound ``<= b`` becomes ``max(b, gain * e)``, ``e`` the floor's metric (``nmse``,
``max_rel``); ``cosine_min`` becomes ``min(c, 1 - gain * (1 - cosine))``; rounded outward to two
significant digits. The gate column says ``(carries mel_features' noise: the reference's own,
xG)``. A ``from`` stage that fails, or whose features all vary, moves nothing, and the stages
fed the reference's own inputs (isolated and replayed forms, which no floor names) still judge
each block's arithmetic alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from audioparity.contract.errors import AudioparityError

LENGTH_SCALING, CARRIED_NOISE = "length_scaling", "carried_noise"
#: The thresholds a ``length_scaling`` rule may scale: bounds on float32 noise.
LENGTH_SCALED = ("nmse_max", "median_row_nmse_max", "max_abs_max", "max_rel_max",
                 "spread_nmse_max", "spread_max_rel_max")
#: The thresholds a ``carried_noise`` rule raises, each with the floor's metric it is a gain of.
CARRIED = {"nmse_max": "nmse", "max_rel_max": "max_rel", "cosine_min": "cosine"}
#: The largest gain a ``carried_noise`` rule may give: a port far beyond the reference's own
#: noise has an error of its own.
GAIN_LIMIT = 100
#: The reference manifest's field holding its noise floor on the case.
NOISE_FLOOR = "noise_floor"


def _rule_error(where: str, message: str) -> AudioparityError:
    return AudioparityError(f"gates: {where}: {message}")


def check_rule(key: str, rule: Any, patterns: list[str]) -> None:
    """Raise unless ``rule`` is a well-formed ``length_scaling`` or ``carried_noise`` rule
    (``key``; module docstring); a length rule's entries must name stage patterns of the
    ``default`` list, ``patterns``.

    Raises:
        AudioparityError: one line naming the rule, the entry and the key that is wrong.
    """
    if key == CARRIED_NOISE:
        _check_carried(rule)
        return
    if not isinstance(rule, Mapping) or set(rule) != {"frames_of", "entries"}:
        raise _rule_error(key, f"expected frames_of and entries, got {rule!r}")
    if not isinstance(rule["frames_of"], str) or not rule["frames_of"]:
        raise _rule_error(key, f"frames_of must name a stage, got {rule['frames_of']!r}")
    if not isinstance(rule["entries"], Mapping) or not rule["entries"]:
        raise _rule_error(key, f"entries must map gate patterns to exponents, got "
                          f"{rule['entries']!r}")
    for pattern, scaling in rule["entries"].items():
        here = f"{key}.entries.{pattern}"
        if pattern not in patterns:
            raise _rule_error(here, "names no entry of the default list (its stage patterns: "
                              f"{', '.join(patterns)})")
        _check_length_entry(here, scaling)


def _check_length_entry(here: str, scaling: Any) -> None:
    if not isinstance(scaling, Mapping) or set(scaling) - {
            "measured_at", "frames_of", *LENGTH_SCALED} or not set(scaling) & set(LENGTH_SCALED):
        raise _rule_error(here, f"expected measured_at, optionally frames_of, and exponents of "
                          f"{', '.join(LENGTH_SCALED)}, got {scaling!r}")
    if not isinstance(scaling.get("frames_of", "x"), str) or not scaling.get("frames_of", "x"):
        raise _rule_error(here, f"frames_of must name a stage, got {scaling['frames_of']!r}")
    measured = scaling.get("measured_at")
    if isinstance(measured, bool) or not isinstance(measured, int) or measured < 1:
        raise _rule_error(here, f"measured_at must be a length in frames >= 1, got "
                          f"{measured!r}")
    for key in LENGTH_SCALED:
        value = scaling.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                0 <= value <= 4):
            raise _rule_error(f"{here}.{key}", f"an exponent from 0 to 4, got {value!r}")


def _check_carried(rule: Any) -> None:
    if not isinstance(rule, Mapping) or set(rule) != {"from", "gain"}:
        raise _rule_error(CARRIED_NOISE, f"expected from and gain, got {rule!r}")
    if not isinstance(rule["from"], str) or not rule["from"]:
        raise _rule_error(CARRIED_NOISE, f"from must name a stage, got {rule['from']!r}")
    gain = rule["gain"]
    if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not (
            1 <= gain <= GAIN_LIMIT):
        raise _rule_error(f"{CARRIED_NOISE}.gain", f"a gain from 1 to {GAIN_LIMIT}, got "
                          f"{gain!r}")


def for_length(gates: Mapping[str, Any], lengths: Mapping[str, int] | None
               ) -> dict[str, Any]:
    """The resolved ``gates`` of a case whose stages are ``lengths`` long (the first axis of
    each in the reference; None: unknown, the gates as they are): each ``default`` entry the
    ``length_scaling`` rule names, where its ``frames_of`` stage (the entry's, else the rule's)
    is longer than its ``measured_at``, with each named threshold times ``(frames /
    measured_at) ** exponent``, rounded up to two significant digits, and ``length`` (the
    frames) for the gate's text. Gates without a rule are returned as they are.

    Raises:
        AudioparityError: a malformed rule.
    """
    rule = gates.get(LENGTH_SCALING)
    if rule is None or lengths is None:
        return dict(gates)
    check_rule(LENGTH_SCALING, rule,
               [e["stage"] for e in gates["gates"] if e.get("from") == "default"])
    scaled = []
    for entry in gates["gates"]:
        scaling = rule["entries"].get(entry["stage"]) if entry.get("from") == "default" else None
        frames = lengths.get(scaling.get("frames_of", rule["frames_of"])) if scaling else None
        if frames and frames > scaling["measured_at"]:
            ratio = frames / scaling["measured_at"]
            entry = {**entry, "length": frames, **{
                key: round_up(entry[key] * ratio ** p) for key, p in scaling.items()
                if key in LENGTH_SCALED and key in entry}}
        scaled.append(entry)
    return {**gates, "gates": scaled}


def noise_floor(gates: Mapping[str, Any], manifest: Mapping[str, Any], stage: str,
                verdict: str, metrics: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The reference's ``noise_floor`` (its ``manifest``'s) that the stages after ``stage``
    carry, once ``stage`` is judged: where it is the ``carried_noise`` rule's ``from``, passed
    (``verdict``) on its spread measures (``metrics["near_constant"]`` > 0) and the floor is
    of it; else None (the bounds as written).

    Raises:
        AudioparityError: a malformed rule.
    """
    rule = gates.get(CARRIED_NOISE)
    floor = manifest.get(NOISE_FLOOR)
    if rule is None or floor is None or rule.get("from") != stage:
        return None
    check_rule(CARRIED_NOISE, rule, [])
    if verdict != "pass" or not (metrics or {}).get("near_constant") or \
            floor.get("from") != stage:
        return None
    return dict(floor)


def carry_noise(gates: Mapping[str, Any], stage: str, floor: Mapping[str, Any] | None
                ) -> Mapping[str, Any]:
    """The resolved ``gates`` that judge ``stage`` under the reference's ``floor``
    (:func:`noise_floor`; None: ``gates`` as they are): each entry matching ``stage`` with its
    bounds raised to the rule's gain times the floor's metrics of ``stage`` (module docstring),
    and where one moved, ``carried`` (the mark for the gate's text). A stage the floor does not
    name (an isolated or replayed form, a stage before the mel's) keeps its bounds."""
    own = (floor or {}).get("stages", {}).get(stage)
    if own is None:
        return gates
    gain = float(gates[CARRIED_NOISE]["gain"])
    mark = f"{floor['from']}' noise: the reference's own, x{gain:g}"
    raised = []
    for entry in gates["gates"]:
        bounds = {key: _carried(key, entry[key], gain, float(own[metric]))
                  for key, metric in CARRIED.items()
                  if key in entry and fnmatchcase(stage, entry["stage"])}
        moved = {key: bound for key, bound in bounds.items() if bound != entry[key]}
        raised.append({**entry, **moved, "carried": mark} if moved else entry)
    return {**gates, "gates": raised}


def _carried(key: str, bound: float, gain: float, error: float) -> float:
    """``bound`` loosened to ``gain`` times the ``from`` stage's ``error`` in the same metric
    (for ``cosine_min``, its distance from 1), never tightened."""
    if key == "cosine_min":
        return min(bound, 1.0 - round_up(gain * (1.0 - error)))
    return max(bound, round_up(gain * error))


def round_up(value: float) -> float:
    """``value`` rounded up to two significant digits (``4.012e-9`` -> ``4.1e-9``)."""
    if value <= 0 or not math.isfinite(value):
        return value
    scale = 10.0 ** (math.floor(math.log10(value)) - 1)
    return float(f"{math.ceil(value / scale - 1e-9) * scale:.2g}")
