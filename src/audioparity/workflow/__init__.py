"""The workflow's logic, which Snakefile and rules/ wire into rules: the config checked into a
sweep plan (:mod:`.plan`), the results-path scheme (:mod:`.paths`), the source files each job
runs (:mod:`.imports`, :mod:`.code`), each job's inputs and memory (:mod:`.jobs`), the
arguments of each rule's command (:mod:`.commands`), and what a finished run prints
(:mod:`.outcome`); and a sweep's cells on a backend packed for a host without the network,
their results merged back (:mod:`.bundle`, which runs Snakemake as a command). Nothing else
here imports Snakemake: the rules' glue (rules/common.smk) turns an
:class:`~audioparity.contract.errors.AudioparityError` into Snakemake's one-line refusal.
"""

from __future__ import annotations

from pathlib import Path


def start(config: dict, src: Path):
    """The sweep of a config validated against config/schema.yaml: checked against the
    registered families and adapters (:class:`~.plan.Sweep`), each reference job's plan
    written where it changed (with the digests of its cases' files), and the
    :class:`~.commands.Commands` (with their :class:`~.jobs.Jobs`) of its rules; ``src``: the
    checkout's source folder.

    Raises:
        AudioparityError: the config's first problem, in one line.
    """
    from audioparity.candidates import load_adapter
    from audioparity.models.registry import registered
    from audioparity.workflow import paths
    from audioparity.workflow.code import Code, write_if_changed
    from audioparity.workflow.commands import Commands
    from audioparity.workflow.digests import Digests
    from audioparity.workflow.jobs import Jobs
    from audioparity.workflow.plan import Sweep

    sweep = Sweep(config, registered(), load_adapter)
    digests = Digests(Path(paths.INPUT_DIGESTS))
    for path, text in sweep.plan_files(digests).items():
        write_if_changed(Path(path), text)
    digests.save()
    return Commands(Jobs(sweep, Code(src, Path(paths.IMPORTS))))
