"""Each stage name is spelled once, in its family's name table (issues 23 and 42): every ``.py``
under src/ and the Python of every rules/*.smk is parsed, and a string constant that is no
docstring and names a registered family's stage, or a concrete form of one (``layer_0``,
``layer_{i}_isolated``, ``decode_margins``), fails the test where it stands.

A family's name table is its :class:`~audioparity.contract.spec.StageName` subclass: its spec's
stages and forms are written with its members, and so is its code (``Names.LAYER.at(3)``). What
a stage is, is its family's spec's (its stages, kinds, forms and margins); the code elsewhere
reads the spec. Allowed:

- a family's own names in the body of its name table;
- the arguments of a ``TensorMap(...)`` in ``src/audioparity/candidates/`` (a shipped adapter
  names the stages it maps);
- the few literals of :data:`ALLOWED`, each a word that is a stage name by coincidence, with
  why.

An f-string counts as its constant parts with each replacement field a placeholder
(``f"layer_{k}"`` is ``layer_{i}``); a name built from variables (``f"{stage}_isolated"``) names
no stage.
"""

from __future__ import annotations

import ast
import inspect
import re
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from audioparity.contract.spec import FORMS, LAYER, StageName
from audioparity.models.registry import registered
from tests import REPO

SRC = REPO / "src"
RULES = REPO / "rules"
CANDIDATES = Path("src/audioparity/candidates")
#: The call whose arguments may name stages in the adapters.
TENSOR_MAP = "TensorMap"

#: (file relative to the checkout, literal, why it is allowed): a word that is also a stage name
#: and means something else where it stands.
ALLOWED: tuple[tuple[str, str, str], ...] = (
    ("src/audioparity/contract/vocabulary.py", "prompt",
     "InputKind: a case that is a prompt file (--prompt), not MOSS's prompt document"),
    ("src/audioparity/models/moss_voicegen/seed.py", "last_hidden",
     "a field of the seed tool's hidden.json, its format's name for the value (module "
     "docstring), not the dump's stage"),
    ("src/audioparity/models/moss_voicegen/references/remote_code.py", "generation",
     "the checkpoint processor's mode argument (mode='generation'), not the generation "
     "document"),
    ("src/audioparity/models/moss_voicegen/remote_code/processing_moss_tts.py", "generation",
     "the processor's mode, in the checkpoint's own remote code kept as upstream wrote it"),
    ("src/audioparity/models/parakeet_tdt/references/nemo.py", "pos_emb",
     "NeMo's ConformerLayer.forward keyword argument the pos_emb tap reads (Taps.input's "
     "keyword), not the stage"),
)
#: The placeholder an f-string's replacement field stands for in :func:`literals`.
FIELD = "\0"


class Literal(NamedTuple):
    """A string constant of the code: where it is, its text, and whether it is an argument of
    a ``TensorMap(...)`` call."""

    path: Path
    line: int
    text: str
    in_tensor_map: bool


class Name(NamedTuple):
    """A stage name of a family, as a pattern: ``layer_{i}_isolated`` matches ``layer_3_isolated``
    and the pattern itself."""

    family: str
    pattern: str

    def matches(self, text: str) -> bool:
        parts = [re.escape(part) for part in self.pattern.split(LAYER)]
        layer = rf"(?:\d+|{re.escape(LAYER)}|{FIELD})"
        return re.fullmatch(layer.join(parts), text) is not None


def stage_names(families: Iterable) -> list[Name]:
    """Every name a family's dump holds: each stage, its forms, and a document's margins."""
    names = []
    for family in families:
        for stage in family.spec.stages:
            for form in FORMS:
                pattern = getattr(stage, form) if form else stage.name
                if pattern:
                    names.append(Name(family.spec.name, pattern))
            if stage.kind == "document":
                names.append(Name(family.spec.name, f"{stage.name}_margins"))
    return names


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the constants that are docstrings (of the module, a class, a function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _called(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def literals(source: str, path: Path, lines: dict[int, int] | None = None) -> Iterator[Literal]:
    """The string constants of ``source`` but its docstrings, f-strings as templates (module
    docstring); ``lines`` maps a compiled line to the file's (a Snakefile's)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    mapped: set[int] = set()
    nodes = sorted(ast.walk(tree), key=lambda n: (getattr(n, "lineno", 0),
                                                   getattr(n, "col_offset", 0)))
    for node in nodes:
        if isinstance(node, ast.Call) and _called(node) == TENSOR_MAP:
            for argument in [*node.args, *(k.value for k in node.keywords)]:
                mapped.update(id(n) for n in ast.walk(argument))
        if isinstance(node, ast.JoinedStr):
            skip.update(id(value) for value in node.values)
            text = "".join(v.value if isinstance(v, ast.Constant) else FIELD for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if id(node) not in skip:
            line = (lines or {}).get(node.lineno, node.lineno)
            yield Literal(path, line, text, id(node) in mapped)


def smk_python(path: Path) -> tuple[str, dict[int, int]]:
    """The Python a Snakefile compiles to, as Snakemake's own parser writes it, and its line
    map (compiled line -> the file's)."""
    from snakemake.parser import parse

    source = types.SimpleNamespace(get_path_or_uri=lambda secret_free=True: str(path))
    workflow = types.SimpleNamespace(sourcecache=types.SimpleNamespace(
        open=lambda _: open(path, encoding="utf-8")))
    lines: dict[int, int] = {}
    code, _ = parse(source, workflow, lines)
    return code, lines


def code_literals(root: Path = REPO) -> Iterator[Literal]:
    """Every literal of src/**/*.py and of rules/*.smk, paths relative to ``root``."""
    for file in sorted((root / "src").rglob("*.py")):
        yield from literals(file.read_text(encoding="utf-8"), file.relative_to(root))
    for file in sorted((root / "rules").glob("*.smk")):
        code, lines = smk_python(file)
        yield from literals(code, file.relative_to(root), lines)


class Table(NamedTuple):
    """Where a family's name table is: its file, relative to the checkout, and the lines of its
    class."""

    path: str
    lines: range


def name_table(family) -> type[StageName]:
    """A family's name table: the :class:`StageName` subclass its spec's stage names are
    members of."""
    return type(family.spec.stages[0].name)


def tables(families: Iterable) -> dict[str, Table]:
    """Each family's :class:`Table`, by the family's name."""
    found = {}
    for family in families:
        table = name_table(family)
        source, first = inspect.getsourcelines(table)
        path = Path(inspect.getsourcefile(table)).resolve().relative_to(REPO).as_posix()
        found[family.spec.name] = Table(path, range(first, first + len(source)))
    return found


def allowed(literal: Literal, name: Name, where: dict[str, Table]) -> bool:
    """Whether ``literal`` may name ``name`` where it stands (module docstring)."""
    path = literal.path.as_posix()
    table = where.get(name.family)
    if table is not None and path == table.path and literal.line in table.lines:
        return True
    if path.startswith(f"{CANDIDATES.as_posix()}/") and literal.in_tensor_map:
        return True
    return any(path == file and literal.text == text for file, text, _ in ALLOWED)


def violations(found: Iterable[Literal], names: list[Name],
               where: dict[str, Table] | None = None) -> list[str]:
    """``file:line: 'literal' is a stage name of <families>`` for each literal that names a
    stage where none of its families allows it."""
    lines = []
    for literal in found:
        named = [name for name in names if name.matches(literal.text)]
        if named and not any(allowed(literal, name, where or {}) for name in named):
            families = ", ".join(sorted({name.family for name in named}))
            text = literal.text.replace(FIELD, "{...}")
            lines.append(f"{literal.path}:{literal.line}: {text!r} is a stage name of {families}")
    return lines


@pytest.fixture(scope="module")
def names() -> list[Name]:
    return stage_names(registered().values())


@pytest.mark.parametrize("family", sorted(registered()))
def test_a_family_s_stages_and_forms_are_the_members_of_one_name_table(family):
    spec = registered()[family].spec
    table = name_table(registered()[family])
    written = [name for stage in spec.stages
               for name in (stage.name, stage.isolated, stage.replayed) if name]
    assert issubclass(table, StageName) and table is not StageName
    assert all(type(name) is table for name in written), [
        name for name in written if type(name) is not table]
    assert set(table) <= set(written) | {f"{stage.name}_margins" for stage in spec.stages}
    assert [repr(name) for name in table] == [repr(name.value) for name in table]


def test_no_stage_name_is_spelled_outside_its_name_table_the_tensor_maps_and_the_tests(names):
    found = violations(code_literals(), names, tables(registered().values()))
    assert not found, "stage names spelled outside their family's spec:\n" + "\n".join(found)


def test_every_allowed_literal_is_still_there_and_still_a_stage_name(names):
    """An allowance whose literal is gone, or no longer a stage name, goes too."""
    found = {(literal.path.as_posix(), literal.text) for literal in code_literals()}
    for file, text, why in ALLOWED:
        assert why and (file, text) in found, (file, text)
        assert any(name.matches(text) for name in names), (file, text)


PLANTED = '''
"""A module whose docstring may name enc_out and layer_3_isolated."""
from audioparity.candidates.adapter import TensorMap

MAPS = [TensorMap("enc.out", "enc_out"), TensorMap(source="blk.{i}", stage="layer_{i}")]


def rows(cell, k):
    """Docstrings are prose: decode_margins."""
    # a comment naming joint_logits is no literal
    first = cell["enc_out"]
    return first, f"layer_{k}_isolated", f"{k}_isolated", "decode_margins", "encoder"
'''


@pytest.mark.parametrize(("where", "expected"), [
    ("src/audioparity/report/planted.py",
     ["src/audioparity/report/planted.py:5: 'enc_out'",
      "src/audioparity/report/planted.py:5: 'layer_{i}'",
      "src/audioparity/report/planted.py:11: 'enc_out'",
      "src/audioparity/report/planted.py:12: 'layer_{...}_isolated'",
      "src/audioparity/report/planted.py:12: 'decode_margins'"]),
    ("src/audioparity/candidates/planted.py",
     ["src/audioparity/candidates/planted.py:11: 'enc_out'",
      "src/audioparity/candidates/planted.py:12: 'layer_{...}_isolated'",
      "src/audioparity/candidates/planted.py:12: 'decode_margins'"]),
    *((f"src/audioparity/models/{family}/planted.py",
       [f"src/audioparity/models/{family}/planted.py:{line}: {text!r}"
        for line, text in ((5, "enc_out"), (5, "layer_{i}"), (11, "enc_out"),
                           (12, "layer_{...}_isolated"), (12, "decode_margins"))])
      for family in ("parakeet_tdt", "whisper", "moss_voicegen")),
])
def test_a_planted_stage_name_fails_where_it_is_not_allowed(names, where, expected):
    found = violations(literals(PLANTED, Path(where)), names)
    assert [line.split(" is a stage name")[0] for line in found] == expected


def test_a_name_table_may_spell_its_family_s_names_and_only_in_its_body(names):
    where = {"parakeet_tdt": Table("src/audioparity/models/parakeet_tdt/planted.py",
                                   range(10, 13))}
    found = violations(literals(PLANTED, Path(where["parakeet_tdt"].path)), names, where)
    assert [line.split(" is a stage name")[0] for line in found] == [
        "src/audioparity/models/parakeet_tdt/planted.py:5: 'enc_out'",
        "src/audioparity/models/parakeet_tdt/planted.py:5: 'layer_{i}'"]


def test_a_snakefile_s_strings_are_read_and_its_comments_are_not(tmp_path, names):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "planted.smk").write_text(
        '# a comment naming enc_out\n\n\ndef stage(wildcards):\n    """enc_out, in prose."""\n'
        '    return "enc_out"\n\n\nrule planted:\n    output:\n        "results/{stage}.npy",\n'
        '    params:\n        stage="joint_logits",\n    shell:\n        "true"\n')
    (tmp_path / "src").mkdir()
    found = violations(code_literals(tmp_path), names)
    assert [line.split(" is a stage name")[0] for line in found] == [
        "rules/planted.smk:6: 'enc_out'", "rules/planted.smk:13: 'joint_logits'"]
