"""One table per naming pair: how one library names a model's parameters against another's
(NeMo against transformers, transformers against openai-whisper), written once and read both
ways, as gguf-py's ``tensor_mapping`` builds every lookup from one table per source naming.
"""

from __future__ import annotations

from dataclasses import dataclass


def _rename(name: str, old: str, new: str) -> str:
    """``name`` with the part ``old`` replaced by ``new``: a part beginning ``^`` only at the
    start of the name, one ending ``$`` only at its end, any other wherever it occurs."""
    start, end = old.startswith("^"), old.endswith("$")
    bare_old, bare_new = old.strip("^$"), new.strip("^$")
    if start and end:
        return bare_new if name == bare_old else name
    if start:
        return bare_new + name[len(bare_old):] if name.startswith(bare_old) else name
    if end:
        return name[:-len(bare_old)] + bare_new if name.endswith(bare_old) else name
    return name.replace(bare_old, bare_new)


@dataclass(frozen=True)
class Renames:
    """The parts of parameter names that differ between two namings, ``(left, right)`` pairs of
    literal parts (``^`` anchors a part at the start of a name, ``$`` at its end; both sides of
    a pair anchor alike), applied in order: :meth:`right` renames left names, :meth:`left`
    right names, the pairs in reverse order. A right part that several pairs share (two
    left namings of one module) maps back to the first pair's left part.

    Raises:
        ValueError: a pair whose two parts are anchored differently.
    """

    pairs: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        for old, new in self.pairs:
            if (old[:1] == "^", old[-1:] == "$") != (new[:1] == "^", new[-1:] == "$"):
                raise ValueError(f"renames: {old!r} and {new!r} are anchored differently")

    def right(self, name: str) -> str:
        """``name`` of the left naming in the right one."""
        for old, new in self.pairs:
            name = _rename(name, old, new)
        return name

    def left(self, name: str) -> str:
        """``name`` of the right naming in the left one."""
        first = {}
        for old, new in self.pairs:
            first.setdefault(new, old)
        for new, old in reversed(list(first.items())):
            name = _rename(name, new, old)
        return name
