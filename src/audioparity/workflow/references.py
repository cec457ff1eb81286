"""The references of a family's sweep (config ``references``, docs/references.md): each entry
checked against the family's implementations, names, models, options and environments
(:func:`read_references`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import IMPLEMENTATION
from audioparity.contract.vocabulary import BACKENDS, FRESH
from audioparity.dumping.environments import check_built

if TYPE_CHECKING:
    from audioparity.workflow.plan import FamilyPlan


@dataclass(frozen=True)
class Reference:
    """A reference of a family's sweep (config ``references``).

    Attributes:
        name: its name: the ``against`` label of the cells compared with it (the primary), the
            ``candidate`` label of its own comparison with the primary (any other).
        implementation: the family's implementation it runs (:attr:`FamilySpec.references`).
        environment: the reference environment it runs in (:mod:`audioparity.dumping.environments`),
            None for the project's own.
        options: the family's reference-side options it runs with, over the section's.
        differences: expected failures of its comparison with the primary, with why.
        models: the models it runs (all of the family's by default).
    """

    name: str
    implementation: str
    environment: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    differences: tuple[Mapping[str, Any], ...] = ()
    models: tuple[str, ...] = ()


def read_references(plan: FamilyPlan, config: Mapping[str, Any]) -> dict[str, Reference]:
    """``{family}.references`` (default: the family's first implementation alone): each an
    implementation of the family's, under a name no other reference or candidate takes, on
    models of the family's; the primary in the project's environment with the section's options,
    on every model, with no declared differences; another's environment one of
    ``environments``, built for its packages, and its options the family's reference-side
    ones.

    Raises:
        AudioparityError: the first entry that breaks one of these.
    """
    spec = plan.spec
    default = spec.references[0]
    references: dict[str, Reference] = {}
    for entry in plan.section.get("references") or [{"name": default,
                                                      "implementation": default}]:
        where = f"config {spec.name}.references {entry['name']!r}"
        if entry["implementation"] not in spec.references:
            raise AudioparityError(f"{where}: implementation {entry['implementation']!r}; "
                                   f"{spec.name} has {', '.join(spec.references)}")
        if entry["name"] in references or entry["name"] in plan.candidates:
            raise AudioparityError(f"{where}: the name is taken by another reference or a "
                                   "candidate")
        if entry["name"] in ("reference", FRESH, *BACKENDS):
            raise AudioparityError(f"{where}: the name is an `against` label of the summary "
                                   f"(reference, {FRESH}, {', '.join(BACKENDS)}); choose "
                                   "another")
        environment, options = entry.get("environment"), entry.get("options") or {}
        models = entry.get("models") or list(plan.models)
        if not references and (environment or entry.get("differences") or options
                               or "models" in entry):
            raise AudioparityError(f"{where}: the primary (the first) runs in the project's "
                                   "environment with the section's options, on every model, "
                                   "and has no differences; list it after another")
        if set(models) - set(plan.models):
            raise AudioparityError(f"{where}: models {sorted(set(models) - set(plan.models))} "
                                   f"are not in {spec.name}.models")
        unknown = sorted(set(options) - {o.name for o in spec.options_for("reference")})
        if unknown:
            raise AudioparityError(f"{where}.options: {unknown[0]!r} is no reference-side "
                                   f"option of {spec.name}")
        values = spec.check_options({**plan.section["options"], **options}, f"{where}.options")
        spec.check_implementation_options({**values, IMPLEMENTATION: entry["implementation"]},
                                          where)
        if environment is not None:
            known = config.get("environments") or {}
            if environment not in known:
                raise AudioparityError(f"{where}: environment {environment!r} is not in "
                                       f"environments ({', '.join(known) or 'none'})")
            check_built(environment, known[environment]["packages"])
        references[entry["name"]] = Reference(entry["name"], entry["implementation"],
                                              environment, options,
                                              tuple(entry.get("differences", ())), tuple(models))
    return references
