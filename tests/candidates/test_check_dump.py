"""``audioparity check-dump`` through the command line: a valid Parakeet-shaped dump passes, and
each problem, planted alone in a copy of it, gives exactly its one line on stdout, the summary
on stderr and exit 1; likewise transcribe.cpp's ``.f32`` + ``.json`` folder and an ``npy``
adapter's folder. Each case of :data:`DOC_CASES` is a row of docs/errors.md ("check-dump"),
verbatim: :func:`check_row` runs a case and gives its row, here and in ``python -m
tests.test_errors``, which regenerates the document."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from audioparity.candidates import Adapter, TensorMap, load_adapter
from audioparity.candidates.check import check_dump
from audioparity.candidates.reading import not_exposed
from audioparity.cli import main
from audioparity.dumping.artifacts import DumpWriter
from audioparity.models.registry import family
from tests import REPO
from tests.test_errors import listing, row

FAMILY = "parakeet_tdt"
#: The commands of the rows: a dump of the contract, transcribe.cpp's raw folder.
CHECK = f"audioparity check-dump dump --family {FAMILY}"
RAW = f"audioparity check-dump raw --family {FAMILY} --adapter transcribe_cpp"
#: Frames of mel, encoder frames, model width, joint width (V=12 + blank + 5 durations),
#: joint evaluations, layers, LSTM width.
T_MEL, T, D, JOINT, STEPS, LAYERS, H = 20, 5, 16, 12 + 1 + 5, 7, 3, 8
DECODE = {"ids": [3, 7], "frames": [0, 2], "durations": [1, 2], "text": "ab"}
LEFT = "the dump as it was (check-dump only reads)"


def stage_tensors(**replace: np.ndarray | None) -> dict[str, tuple[np.ndarray, str]]:
    """Random float32 tensors of every Parakeet-TDT tensor stage, shaped as the spec's layouts
    say; ``replace`` swaps one array (None drops the stage)."""
    rng = np.random.default_rng(0)

    def a(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    tensors = {"mel_features": (a(T_MEL, 80), "[T, n_mels]"), "pre_encode": (a(T, D), "[T, D]"),
               "pos_emb": (a(2 * T - 1, D), "[2T-1, D]"),
               **{f"layer_{i}": (a(T, D), "[T, D]") for i in range(LAYERS)},
               "enc_out": (a(T, D), "[T, D]"),
               "joint_logits": (a(STEPS, JOINT), "[steps, V+1+n_durations]"),
               "lstm_state_0": (a(1, 2, H), "[layers, 2, H]"),
               "decode_logits": (a(STEPS, JOINT), "[steps, V+1+n_durations]")}
    for name, array in replace.items():
        if array is None:
            del tensors[name]
        else:
            tensors[name] = (array, tensors.get(name, (None, "[T, D]"))[1])
    return tensors


def write_dump(path: Path, tensors: dict | None = None, documents: dict | None = None,
               fields: dict | None = None, status: tuple[str, str] | None = None) -> Path:
    """A dump of the contract at ``path`` through :class:`DumpWriter` (valid by default)."""
    tensors = stage_tensors() if tensors is None else tensors
    documents = {"decode": DECODE} if documents is None else documents
    with DumpWriter(path, producer="test", fields=fields) as writer:
        for name, (array, layout) in tensors.items():
            writer.add_tensor(name, array, layout)
        for name, document in documents.items():
            writer.add_json(name, document)
        if status:
            writer.set_status(*status)
    return path


def edit_manifest(dump: Path, edit: Callable[[dict], None]) -> None:
    manifest = json.loads((dump / "manifest.json").read_text())
    edit(manifest)
    (dump / "manifest.json").write_text(json.dumps(manifest))


def with_nan(count: int, inf: int = 0, shape: tuple[int, ...] = (T, D)) -> np.ndarray:
    array = np.ones(shape, np.float32)
    array.flat[:count] = np.nan
    array.flat[count:count + inf] = np.inf
    return array


# --- the cases: a valid dump with one thing broken ---------------------------------------------


@dataclass(frozen=True)
class Case:
    """One problem, one row of docs/errors.md: what is broken, how (``make`` writes ``dump`` or
    ``raw`` into the folder it is given), the line, and the command that finds it."""

    id: str
    input: str
    make: Callable[[Path], object]
    line: str
    command: str = CHECK


def tensors_case(**replace: np.ndarray | None) -> Callable[[Path], object]:
    return lambda cwd: write_dump(cwd / "dump", stage_tensors(**replace))


def documents_case(documents: dict) -> Callable[[Path], object]:
    return lambda cwd: write_dump(cwd / "dump", documents=documents)


def then(action: Callable[[Path], object]) -> Callable[[Path], object]:
    """A valid dump, then ``action`` on it."""
    return lambda cwd: action(write_dump(cwd / "dump"))


def cut_bytes(file: str, count: int) -> Callable[[Path], None]:
    def cut(dump: Path) -> None:
        data = (dump / file).read_bytes()
        (dump / file).write_bytes(data[:-count])
    return cut


EVERY = "expected every stage of parakeet_tdt but isolated and replayed forms"
TD_SHAPE = "(every [T, D] stage of a dump has one shape)"
FIELDS = "expected an object with fields ids, frames, durations, text"

CASES = (
    Case("missing_stage", "a stage missing (no `enc_out`)", tensors_case(enc_out=None),
         f"dump: missing stage 'enc_out' (tensor [T, D]); {EVERY}"),
    Case("missing_document", "the decode document missing", documents_case({}),
         "dump: missing stage 'decode' (document {ids, frames, durations, text}); " + EVERY),
    Case("no_layer", "no per-layer stage at all",
         tensors_case(**{f"layer_{i}": None for i in range(LAYERS)}),
         "dump: missing stage 'layer_0' (tensor [T, D]); expected at least layer_0"),
    Case("layer_gap", "layers 0 and 2 without layer 1", tensors_case(layer_1=None),
         "dump: missing stage 'layer_1' (tensor [T, D]); expected layers 0..2 without gaps"),
    Case("rank", "a `[T, D]` stage of rank 3",
         tensors_case(enc_out=np.ones((T, D, 1), np.float32)),
         "dump/enc_out.npy: shape [5, 16, 1] has rank 3; expected rank 2 (layout [T, D])"),
    Case("other_frames", "one layer with another T than the other `[T, D]` stages",
         tensors_case(layer_2=np.ones((T + 1, D), np.float32)),
         f"dump/layer_2.npy: shape [6, 16]; expected [5, 16] like pre_encode {TD_SHAPE}"),
    Case("numeric_axis", "`[layers, 2, H]` with 3 on its axis of 2",
         tensors_case(lstm_state_0=np.ones((1, 3, H), np.float32)),
         "dump/lstm_state_0.npy: shape [1, 3, 8] has 3 on axis 1; expected 2 (layout "
         "[layers, 2, H])"),
    Case("float16", "a float16 stage", tensors_case(layer_0=np.ones((T, D), np.float16)),
         "dump/layer_0.npy: dtype float16; expected float32"),
    Case("float64", "a float64 stage", tensors_case(layer_0=np.ones((T, D), np.float64)),
         "dump/layer_0.npy: dtype float64; expected float32"),
    Case("int32", "an int32 stage", tensors_case(layer_0=np.ones((T, D), np.int32)),
         "dump/layer_0.npy: dtype int32; expected float32"),
    Case("truncated_npy", "a `.npy` cut short by 5 bytes", then(cut_bytes("layer_0.npy", 5)),
         "dump/layer_0.npy: 315 data bytes, expected 320 for shape [5, 16] of float32 "
         "(truncated?)"),
    Case("corrupt_npy", "a `.npy` that is text",
         then(lambda dump: (dump / "layer_0.npy").write_text("not an array")),
         "dump/layer_0.npy: unreadable .npy (the magic string is not correct; expected "
         "b'\\x93NUMPY', got b'not an')"),
    Case("all_nan", "a stage all NaN", tensors_case(enc_out=with_nan(T * D)),
         "dump/enc_out.npy: all 80 values non-finite (80 NaN); expected finite values"),
    Case("some_non_finite", "a stage with 2 NaN and 1 infinity",
         tensors_case(layer_1=with_nan(2, inf=1)),
         "dump/layer_1.npy: 3 of 80 values non-finite (2 NaN, 1 +inf); expected finite values"),
    Case("logits_nan", "a logits stage with a NaN (-inf alone is a masked class)",
         tensors_case(joint_logits=with_nan(1, shape=(STEPS, JOINT))),
         "dump/joint_logits.npy: 1 of 126 values non-finite (1 NaN); expected finite values or "
         "-inf (a masked class)"),
    Case("unknown_file", "a file the manifest does not list",
         then(lambda dump: (dump / "notes.txt").write_text("hello")),
         "dump/notes.txt: unknown file; expected only manifest.json, the files it lists and "
         "raw/"),
    Case("unlisted_npy", "a `.npy` the manifest does not list",
         then(lambda dump: np.save(dump / "layer_3.npy", np.ones((T, D), np.float32))),
         "dump/layer_3.npy: unknown file; expected only manifest.json, the files it lists and "
         "raw/"),
    Case("unknown_stage", "a listed tensor that is no stage of the family",
         tensors_case(attention_probs=np.ones((T, T), np.float32)),
         "dump/attention_probs.npy: tensor 'attention_probs' is no stage of parakeet_tdt; "
         "expected one of mel_features, pre_encode, pos_emb, layer_{i}, enc_out, joint_logits, "
         "lstm_state_0, decode, decode_logits, ctc_logits, ctc_decode, their isolated or "
         "replayed forms, or <document>_margins"),
    Case("listed_file_missing", "a listed `.npy` deleted",
         then(lambda dump: (dump / "pos_emb.npy").unlink()),
         "dump/pos_emb.npy: missing; manifest.json lists it as tensor 'pos_emb'"),
    Case("layout", "a stage listed with another layout",
         then(lambda dump: edit_manifest(dump, lambda m: m["tensors"]["enc_out"].update(
             layout="[D, T]"))),
         "dump/enc_out.npy: layout '[D, T]' in manifest.json; expected '[T, D]' (stage enc_out)"),
    Case("manifest_dtype", "a manifest dtype the `.npy` header does not have",
         then(lambda dump: edit_manifest(dump, lambda m: m["tensors"]["enc_out"].update(
             dtype="float64"))),
         "dump/enc_out.npy: [5, 16] float32 in its header; manifest.json says [5, 16] float64"),
    Case("document_list", "a document that is a JSON list", documents_case({"decode": [1, 2]}),
         f"dump/decode.json: a JSON list; {FIELDS} (stage decode)"),
    Case("document_field", "a document without `text`",
         documents_case({"decode": {k: v for k, v in DECODE.items() if k != "text"}}),
         f"dump/decode.json: lacks field(s) text; {FIELDS} (stage decode "
         "{ids, frames, durations, text})"),
    Case("document_not_json", "a document that is not JSON",
         then(lambda dump: (dump / "decode.json").write_text("{")),
         "dump/decode.json: unreadable JSON (Expecting property name enclosed in double quotes: "
         f"line 1 column 2 (char 1)); {FIELDS}"),
    Case("crashed", "a dump of status crashed",
         lambda cwd: write_dump(cwd / "dump", {}, {}, status=("crashed", "killed by SIGSEGV")),
         "dump/manifest.json: status 'crashed' (killed by SIGSEGV); expected ok (its required "
         "stages are not checked)"),
    Case("other_family", "a manifest of another family",
         lambda cwd: write_dump(cwd / "dump", fields={"family": "whisper"}),
         "dump/manifest.json: family 'whisper'; expected parakeet_tdt"),
    Case("no_manifest", "a folder without manifest.json",
         then(lambda dump: (dump / "manifest.json").unlink()),
         "dump: no manifest.json; expected a dump of the contract (a tool's raw folder is "
         "checked with --adapter)"),
    Case("manifest_not_json", "manifest.json that is not JSON",
         then(lambda dump: (dump / "manifest.json").write_text("{")),
         "dump/manifest.json: unreadable manifest (Expecting property name enclosed in double "
         "quotes: line 1 column 2 (char 1))"),
    Case("manifest_entry", "a manifest entry whose shape is a string",
         then(lambda dump: edit_manifest(dump, lambda m: m["tensors"]["enc_out"].update(
             shape="5x16"))),
         "dump/manifest.json: tensors['enc_out'] is {\"dtype\": \"float32\", \"file\": "
         "\"enc_out.npy\", \"layout\": \"[T, D]\", \"shape\": \"5x16\"}; expected {file: "
         "'<name>.npy', shape: [int, ...], dtype: a numpy dtype name, layout: one line}"),
    Case("conventions", "manifest `conventions` whose `omits` is a string",
         then(lambda dump: edit_manifest(dump, lambda m: m.update(
             conventions={"decode": {"omits": "text"}}))),
         "dump/manifest.json: 'conventions' is {\"decode\": {\"omits\": \"text\"}}; expected "
         "{stage: {view: [[row, k] | [log_softmax], ...], omits: [field, ...], why: one line}}"),
    Case("not_exposed", "manifest `not_exposed` that is a list",
         then(lambda dump: edit_manifest(dump, lambda m: m.update(not_exposed=["enc_out"]))),
         "dump/manifest.json: 'not_exposed' is [\"enc_out\"]; expected {stage of the family's "
         "spec: why (one line)}"),
    Case("not_exposed_stage", "`not_exposed` naming `layer_0`, not the spec's `layer_{i}`",
         then(lambda dump: edit_manifest(dump, lambda m: m.update(
             not_exposed={"layer_0": "a port without taps"}))),
         "dump/manifest.json: not_exposed names 'layer_0', no stage of parakeet_tdt; expected "
         "stages of its spec (mel_features, pre_encode, pos_emb, layer_{i}, enc_out, "
         "joint_logits, lstm_state_0, decode, decode_logits, ctc_logits, ctc_decode)"),
)


def check_row(case: Case, folder: Path) -> str:
    """Plant ``case`` in the empty folder ``folder`` and run its command there through
    :func:`audioparity.cli.main`; assert exit 1, exactly one problem line on stdout, stderr
    ending with the summary, and the folder as it was; the case's docs/errors.md row, with the
    line as printed."""
    case.make(folder)
    before = listing(folder)
    out, err = io.StringIO(), io.StringIO()
    previous = Path.cwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(case.command.split()[1:])
    finally:
        os.chdir(previous)
    lines = out.getvalue().splitlines()
    assert (code, len(lines)) == (1, 1), (case.id, code, lines, err.getvalue()[-2000:])
    directory = case.command.split()[2]
    assert err.getvalue().splitlines()[-1] == (
        f"audioparity: error: {directory}: 1 problem(s) against the dump contract of {FAMILY}, "
        "listed on stdout")
    assert listing(folder) == before, f"{case.command} changed {folder}"
    return row(case.input, (case.command,), code, lines[0], LEFT)


def run_check(cwd: Path, command: str, capsys) -> tuple[int, list[str], str]:
    """``command`` (``audioparity check-dump ...``) through :func:`audioparity.cli.main` in
    ``cwd``: exit code, stdout lines, stderr."""
    code = main(command.split()[1:])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def doc() -> str:
    return (REPO / "docs" / "errors.md").read_text(encoding="utf-8")


def test_a_valid_dump_passes(cwd, capsys):
    dump = write_dump(cwd / "dump")
    (dump / "raw").mkdir()  # a third-party candidate's own files: allowed
    (dump / "raw" / "stdout.txt").write_text("")
    (dump / ".snakemake_timestamp").write_text("")
    code, lines, err = run_check(cwd, CHECK, capsys)
    assert (code, lines) == (0, ["ok: dump: a dump of parakeet_tdt: 10 tensor(s), 1 "
                                 "document(s), layers 0..2"]), err


def test_forms_margins_masked_logits_and_omitted_fields_pass(cwd, capsys):
    tensors = stage_tensors(joint_logits=np.where(np.arange(JOINT) == 3, -np.inf, 1.0)[None]
                            .repeat(STEPS, 0).astype(np.float32))
    tensors["layer_1_isolated"] = (np.ones((T, D), np.float32), "[T, D]")
    tensors["decode_margins"] = (np.array([np.inf, 0.5], np.float32), "[positions]")
    dump = write_dump(cwd / "dump", tensors, {"decode": {**DECODE, "text": None},
                                              "decoder_replay": DECODE})
    edit_manifest(dump, lambda m: m.update(conventions={"decode": {"omits": ["text"]}}))
    (dump / "decode.json").write_text(json.dumps({k: DECODE[k] for k in DECODE if k != "text"}))
    assert check_dump(dump, FAMILY) == []


def test_a_dump_of_a_port_exposing_only_its_decode_passes(cwd, capsys):
    with DumpWriter(cwd / "dump", producer="whisper_cpp", fields={"family": FAMILY}) as writer:
        writer.add_json("decode", DECODE)
        not_exposed(writer, load_adapter("whisper_cpp"), family(FAMILY).spec)  # as candidate run
    code, lines, err = run_check(cwd, CHECK, capsys)
    assert (code, lines) == (0, ["ok: dump: a dump of parakeet_tdt: 0 tensor(s), 1 document(s), "
                                 "8 stage(s) not exposed"]), err
    edit_manifest(cwd / "dump", lambda m: m["not_exposed"].pop("layer_{i}"))
    assert check_dump("dump", FAMILY) == [
        "dump: missing stage 'layer_0' (tensor [T, D]); expected at least layer_0"]
    edit_manifest(cwd / "dump", lambda m: m.pop("not_exposed"))
    assert len(check_dump(cwd / "dump", FAMILY)) == 8  # every tensor stage missing


def test_every_problem_is_listed(cwd, capsys):
    write_dump(cwd / "dump", stage_tensors(layer_1=None, enc_out=with_nan(T * D)))
    (cwd / "dump" / "notes.txt").write_text("")
    code, lines, _ = run_check(cwd, CHECK, capsys)
    assert code == 1 and len(lines) == 3, lines
    assert [line.split(":")[0] for line in lines] == ["dump/enc_out.npy", "dump", "dump/notes.txt"]


# --- a tool's raw folder through its adapter -----------------------------------------------------


def write_pair(folder: Path, name: str, array: np.ndarray, **meta) -> None:
    """transcribe.cpp's ``<name>.f32`` (raw little-endian float32) + ``<name>.json``."""
    folder.mkdir(exist_ok=True)
    np.ascontiguousarray(array, "<f4").tofile(folder / f"{name}.f32")
    sidecar = {"name": name, "shape": list(array.shape), "dtype": "f32", "layout": "row-major"}
    (folder / f"{name}.json").write_text(json.dumps({**sidecar, **meta}))


def transcribe_folder(folder: Path, **replaced: np.ndarray | None) -> Path:
    """What ``transcribe-cli`` writes with ``TRANSCRIBE_DUMP_DIR``, named as the adapter's
    TensorMaps: the mel mel-major with one frame more, one joint row, h and c per layer; and
    the taps the adapter declares unmapped (block 0's sub-blocks, the decoder's embedding and
    its copy of the encoder output)."""
    rng = np.random.default_rng(1)

    def a(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    arrays = {"enc.mel.in": a(80, T_MEL + 1), "enc.pre_encode.out": a(T, D),
              "enc.pos_emb": a(2 * T - 1, D),
              **{f"enc.block.{i}.out": a(T, D) for i in range(LAYERS)}, "enc.final": a(T, D),
              "dec.joint.0": a(JOINT), "dec.lstm.0.h.0": a(H), "dec.lstm.0.c.0": a(H),
              **{f"enc.block.0.{part}": a(T, D) for part in ("attn", "conv", "ff1", "ff2")},
              "dec.embed.0": a(H), "dec.enc_out": a(T, D)}
    arrays.update(replaced)
    for name, array in arrays.items():
        if array is not None:
            write_pair(folder, name, array)
    (folder / "stdout.txt").write_text("tokens:\n")
    return folder


SOURCES = ("enc.mel.in, enc.pre_encode.out, enc.pos_emb, enc.block.{i}.out, enc.final, "
           "dec.joint.0, dec.lstm.{i}.h.0, dec.lstm.{i}.c.0, or a file it declares unmapped "
           "(enc.block.{i}.attn, enc.block.{i}.conv, enc.block.{i}.ff1, enc.block.{i}.ff2, "
           "dec.embed.{i}, dec.enc_out)")


def raw_then(action: Callable[[Path], object]) -> Callable[[Path], object]:
    return lambda cwd: action(transcribe_folder(cwd / "raw"))


RAW_CASES = (
    Case("f32_truncated", "a `.f32` cut short by 4 bytes", raw_then(cut_bytes("enc.final.f32", 4)),
         "raw/enc.final.f32: 316 bytes, expected 320 for shape [5, 16] of f32 (truncated?)"),
    Case("f32_without_sidecar", "a `.f32` without its `.json` sidecar",
         raw_then(lambda raw: (raw / "enc.pos_emb.json").unlink()),
         "raw/enc.pos_emb.f32: has no .json sidecar; expected enc.pos_emb.json with its shape"),
    Case("sidecar_without_f32", "a sidecar without its `.f32`",
         raw_then(lambda raw: (raw / "enc.pos_emb.f32").unlink()),
         "raw/enc.pos_emb.f32: missing; its sidecar enc.pos_emb.json lists it"),
    Case("sidecar_f16", "a sidecar of dtype f16",
         lambda cwd: write_pair(transcribe_folder(cwd / "raw"), "enc.final",
                                np.ones((T, D), np.float32), dtype="f16"),
         "raw/enc.final.json: dtype 'f16', layout 'row-major'; expected f32, row-major"),
    Case("f32_missing_layer", "a folder without `enc.block.1.out`",
         lambda cwd: transcribe_folder(cwd / "raw", **{"enc.block.1.out": None}),
         "raw: missing enc.block.1.out.f32 (stage layer_1); expected layers 0..2 without gaps"),
    Case("f32_missing_stacked", "a folder with the LSTM's h but not its c",
         lambda cwd: transcribe_folder(cwd / "raw", **{"dec.lstm.0.c.0": None}),
         "raw: missing dec.lstm.0.c.0.f32 (stage lstm_state_0); expected layers 0..0 without "
         "gaps"),
    Case("f32_unmapped", "a tensor the adapter neither maps nor declares unmapped "
         "(`dec.joint.1`)",
         lambda cwd: write_pair(transcribe_folder(cwd / "raw"), "dec.joint.1",
                                np.zeros(JOINT, np.float32)),
         f"raw/dec.joint.1.f32: maps to no stage of parakeet_tdt through adapter "
         f"'transcribe_cpp'; expected one of {SOURCES}"),
    Case("f32_unmapped_truncated", "a tensor the adapter declares unmapped, cut short (`candidate "
         "run` reads it too)", raw_then(cut_bytes("enc.block.0.attn.f32", 4)),
         "raw/enc.block.0.attn.f32: 316 bytes, expected 320 for shape [5, 16] of f32 "
         "(truncated?)"),
    Case("f32_other_frames", "a layer with another T",
         lambda cwd: transcribe_folder(cwd / "raw", **{"enc.block.2.out": np.ones(
             (T + 1, D), np.float32)}),
         f"raw/enc.block.2.out.f32 (layer_2): shape [6, 16]; expected [5, 16] like pre_encode "
         f"{TD_SHAPE}"),
    Case("f32_transposed_rank", "a transposed mel of rank 3",
         lambda cwd: transcribe_folder(cwd / "raw", **{"enc.mel.in": np.ones(
             (80, T_MEL + 1, 1), np.float32)}),
         "raw/enc.mel.in.f32 (mel_features, its [n_mels, T] transposed): shape [1, 21, 80] has "
         "rank 3; expected rank 2 (layout [T, n_mels])"),
    Case("f32_view_rank", "a joint row (a view of one row) of rank 2",
         lambda cwd: transcribe_folder(cwd / "raw", **{"dec.joint.0": np.ones(
             (2, JOINT), np.float32)}),
         "raw/dec.joint.0.f32 (joint_logits): shape [2, 18] has rank 2; expected rank 1 (layout "
         "[steps, V+1+n_durations] less the 1 row axis its view takes)"),
    Case("f32_nan", "a `.f32` all NaN",
         lambda cwd: transcribe_folder(cwd / "raw", **{"enc.final": with_nan(T * D)}),
         "raw/enc.final.f32 (enc_out): all 80 values non-finite (80 NaN); expected finite "
         "values"),
    Case("f32_unknown_file", "a file that is neither `.f32` nor `.json`",
         raw_then(lambda raw: (raw / "log.txt").write_text("")),
         "raw/log.txt: unknown file; expected .f32 or .json files of adapter 'transcribe_cpp'"),
    Case("f32_manifest", "a dump of the contract given with an f32json adapter",
         raw_then(lambda raw: (raw / "manifest.json").write_text("{}")),
         "raw/manifest.json: a dump of the contract; expected adapter 'transcribe_cpp''s raw "
         "output (check a dump without --adapter)"),
)
RAW_CASES = tuple(replace(case, command=RAW) for case in RAW_CASES)

TOKENS_CASE = Case(
    "tokens_adapter", "an adapter that writes no files (output `tokens`)",
    lambda cwd: write_dump(cwd / "dump"),
    "dump: adapter 'whisper_cpp' writes no files (output 'tokens': only the decode it prints): "
    "nothing to check; expected an adapter of output dump, f32json or npy",
    command=f"{CHECK} --adapter whisper_cpp")

#: Every row of docs/errors.md's "check-dump" section, in its order.
DOC_CASES = (*CASES, *RAW_CASES, TOKENS_CASE)


@pytest.mark.parametrize("case", DOC_CASES, ids=[case.id for case in DOC_CASES])
def test_each_problem_is_one_line_and_a_row_of_the_doc(case, tmp_path, doc):
    expected = row(case.input, (case.command,), 1, case.line, LEFT)
    assert check_row(case, tmp_path) == expected
    assert expected in doc


def test_a_valid_f32json_folder_passes(cwd, capsys):
    transcribe_folder(cwd / "raw")
    (cwd / "raw" / "inputs").mkdir()  # what `candidate run` prepares for the tool: allowed
    code, lines, err = run_check(cwd, RAW, capsys)
    assert (code, lines) == (0, ["ok: raw: 32 file(s) of adapter 'transcribe_cpp' (12 of them "
                                 "declared unmapped, not compared) onto 9 stage(s) of "
                                 "parakeet_tdt, layers 0..2"]), err


def test_read_folder_refuses_the_first_problem(cwd):
    from audioparity.candidates.f32json import read_folder
    from audioparity.contract.errors import AudioparityError

    raw = transcribe_folder(cwd / "raw")
    assert read_folder(raw)["enc.mel.in"].shape == (80, T_MEL + 1)
    cut_bytes("enc.final.f32", 4)(raw)
    with pytest.raises(AudioparityError, match=r"enc\.final\.f32: 316 bytes, expected 320"):
        read_folder(raw)


def test_a_dump_adapter_checks_the_contract(cwd, capsys):
    write_dump(cwd / "dump", stage_tensors(enc_out=None))
    code, lines, _ = run_check(cwd, f"{CHECK} --adapter command", capsys)
    assert (code, lines) == (1, [f"dump: missing stage 'enc_out' (tensor [T, D]); {EVERY}"])


@pytest.mark.parametrize("command, message", [
    (f"{CHECK} --adapter nope", "unknown adapter 'nope': not one of the shipped adapters ("),
    (f"{CHECK} --adapter ports/nope.py", "adapter 'ports/nope.py': no such file: "),
    ("audioparity check-dump dump --family wav2vec", "unknown family 'wav2vec'; registered: "),
    ("audioparity check-dump dump --family whisper --adapter transcribe_cpp",
     "adapter 'transcribe_cpp' implements parakeet_tdt, not whisper"),
    ("audioparity check-dump none --family parakeet_tdt",
     "none: no such directory; expected a dump directory"),
])
def test_a_wrong_invocation_is_one_error_line(command, message, cwd, capsys):
    write_dump(cwd / "dump")
    code, lines, err = run_check(cwd, command, capsys)
    assert (code, lines) == (1, [])
    assert err.splitlines()[-1].startswith(f"audioparity: error: {message}")


# --- an npy adapter (the seeds' tools: .npy tensors, .json documents, no manifest) -------------

SEED_TOOL = {"name": "seed_tool", "title": "a seed tool", "families": (FAMILY,), "output": "npy",
             "weight_types": ("f32",), "tensors": (
                 TensorMap("encoder_out", "enc_out"), TensorMap("layer{i}_out", "layer_{i}"),
                 TensorMap("decoder_tokens", "decode", omits=("text",),
                           why="the tool writes no text"))}
NPY = Adapter(**SEED_TOOL)


def npy_folder(folder: Path) -> Path:
    folder.mkdir()
    np.save(folder / "encoder_out.npy", np.ones((T, D), np.float32))
    for i in range(2):
        np.save(folder / f"layer{i}_out.npy", np.ones((T, D), np.float32))
    (folder / "decoder_tokens.json").write_text(json.dumps(
        {k: v for k, v in DECODE.items() if k != "text"}))
    return folder


def test_an_npy_folder_is_read_through_its_adapter(tmp_path):
    folder = npy_folder(tmp_path / "seed")
    assert check_dump(folder, FAMILY, NPY) == []
    np.save(folder / "layer1_out.npy", np.ones((T, D), np.float64))
    (folder / "decoder_tokens.json").write_text(json.dumps({"ids": [], "durations": []}))
    np.save(folder / "encoder_out_extra.npy", np.ones(2, np.float32))
    shutil.copy(folder / "decoder_tokens.json", folder / "layer0_out.json")
    assert check_dump(folder, FAMILY, NPY) == [
        f"{folder}/decoder_tokens.json: lacks field(s) frames; expected an object with fields "
        "ids, frames, durations (stage decode {ids, frames, durations, text})",
        f"{folder}/encoder_out_extra.npy: maps to no stage of parakeet_tdt through adapter "
        "'seed_tool'; expected one of encoder_out, layer{i}_out, decoder_tokens",
        f"{folder}/layer0_out.json (layer_0): a .json file for a tensor stage; expected .npy",
        f"{folder}/layer1_out.npy (layer_1): dtype float64; expected float32",
    ]
    (folder / "layer0_out.npy").unlink()
    assert f"{folder}: missing layer0_out.npy (stage layer_0); expected layers 0..1 without " \
           "gaps" not in check_dump(folder, FAMILY, NPY)  # layer0_out.json stands for it
    (folder / "layer0_out.json").unlink()
    assert f"{folder}: missing layer0_out.npy (stage layer_0); expected layers 0..1 without " \
           "gaps" in check_dump(folder, FAMILY, NPY)


def test_files_an_npy_adapter_declares_unmapped_are_allowed_if_readable(tmp_path):
    adapter = Adapter(**SEED_TOOL, unmapped=("layer{i}_attn", "timings"))
    folder = npy_folder(tmp_path / "seed")
    np.save(folder / "layer0_attn.npy", np.full((T, D), np.nan, np.float32))  # values unchecked
    (folder / "timings.json").write_text("[1, 2]")  # any JSON
    assert check_dump(folder, FAMILY, adapter) == []
    assert check_dump(folder, FAMILY, NPY)[0] == (
        f"{folder}/layer0_attn.npy: maps to no stage of parakeet_tdt through adapter 'seed_tool'; "
        "expected one of encoder_out, layer{i}_out, decoder_tokens")
    (folder / "layer1_attn.npy").write_text("not an array")
    (folder / "timings.json").write_text("{")
    assert check_dump(folder, FAMILY, adapter) == [
        f"{folder}/layer1_attn.npy: unreadable .npy (the magic string is not correct; expected "
        "b'\\x93NUMPY', got b'not an')",
        f"{folder}/timings.json: unreadable JSON (Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1)); expected the JSON document adapter 'seed_tool' "
        "writes",
    ]
