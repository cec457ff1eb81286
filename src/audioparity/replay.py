"""What every family's reference-side replay shares (docs/candidates.md, "Replay"): the replay
dump's writer, its refusal of a candidate dump that is not ok, the reference model loaded as the
cell's weight type computes, and the record of what it could not replay."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from audioparity.artifacts import Dump, DumpWriter
from audioparity.storage import emulating


def replay_writer(output_dir: Path, candidate: Dump, *, producer: str, model: Path,
                  inputs: dict[str, Path], family: str, threads: int, emulate: str | None,
                  versions: Sequence[str]) -> DumpWriter:
    """The writer of a replay dump (atomic, as every dump): manifest fields ``family``,
    ``threads``, ``replay: true``, ``emulates`` for a quantized cell's replay, and the
    candidate's dump among its inputs."""
    return DumpWriter(output_dir, producer=producer, model=model,
                      inputs={**inputs, "candidate": candidate.path},
                      fields={"family": family, "threads": threads, "replay": True,
                              **({"emulates": {"weight_type": emulate, "backend": "cpu"}}
                                 if emulate else {})},
                      versions=tuple(versions))


def nothing_to_replay(writer: DumpWriter, candidate: Dump) -> bool:
    """Whether the candidate dump is not ``ok`` (unavailable, crashed); then the replay takes
    its status, and says so."""
    if candidate.status == "ok":
        return False
    writer.set_status(candidate.status, f"the candidate dump is {candidate.status}: nothing to "
                      "replay")
    return True


def load_emulated(writer: DumpWriter, stack: ExitStack, load: Callable[[], Any],
                  emulate: str | None) -> Any:
    """The reference model from ``load()``, timed as ``load``, computing within ``stack`` as
    ggml's CPU backend does with weight type ``emulate`` (:func:`.storage.emulating`; its notes
    go to the dump) when one is given."""
    with writer.timed("load"):
        model = load()
        if emulate:
            for note in stack.enter_context(emulating(model, emulate)):
                writer.note(note)
    return model


def record_skipped(writer: DumpWriter, skipped: dict[str, str]) -> None:
    """The replayed forms not written, with why, as the manifest's ``skipped`` and a note
    each (the compare reports them ``missing`` with that reason)."""
    writer.manifest["skipped"] = skipped
    for name, why in skipped.items():
        writer.note(f"{name} not replayed: {why}")
