"""The adapter protocol: every shipped adapter is an :class:`Adapter` subclass whose declarations
hold together; a user's adapter is found by a path to its file or by an entry point, and run
through ``audioparity candidate run`` without touching the tool; every way of naming one wrongly
is one error line; the family's own port runs in process and dumps what ``audioparity ggml``
dumps."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from audioparity.candidates import (
    OUTPUTS,
    Adapter,
    TensorMap,
    ToolCall,
    check_adapter,
    load_adapter,
)
from audioparity.candidates.registry import registered
from audioparity.cli import main
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump, DumpWriter
from audioparity.models.registry import family
from audioparity.models.registry import registered as registered_families

#: A user's port adapter, as docs/candidates.md shows one: a tool that prints its decode (here
#: a Python one-liner), read by ``parse``; one stage it says why it does not expose.
MY_PORT = '''\
"""my.cpp as a Parakeet-TDT candidate: it prints one token a line, `id frame duration`."""

import sys

from audioparity.candidates import Adapter, TensorMap


class MyPort(Adapter):
    name = "my_cpp"
    title = "my.cpp"
    families = ("parakeet_tdt",)
    output = "tokens"
    weight_types = ("f32",)
    printed = TensorMap("stdout", "decode")
    unexposed = {"enc_out": "its encoder output lives in a fused kernel"}
    replays = False

    def run(self, call):
        return [([sys.executable, "-c", "print('3 0 1'); print('5 2 0')"], {})]

    def parse(self, stdout, stderr, model, *, options):
        rows = [list(map(int, line.split())) for line in stdout.splitlines()]
        return {"ids": [r[0] for r in rows], "frames": [r[1] for r in rows],
                "durations": [r[2] for r in rows], "text": ""}
'''


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# --- the shipped adapters ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(registered()))
def test_every_shipped_adapter_is_an_adapter_subclass_whose_declarations_hold(name):
    adapter = registered()[name]
    assert isinstance(adapter, Adapter) and type(adapter) is not Adapter
    assert load_adapter(name) is adapter and adapter.name == name
    assert adapter.title and adapter.families and adapter.output in OUTPUTS
    assert adapter.converts == adapter.overrides("convert")
    assert adapter.family_port or adapter.overrides("run"), "a third-party port runs commands"
    assert (adapter.printed is not None) == adapter.overrides("parse")
    assert adapter.output != "tokens" or adapter.printed is not None, "a tokens port prints"
    printed = (adapter.printed,) if adapter.printed else ()
    for family_name in adapter.families:
        spec = family(family_name).spec
        for mapping in (*adapter.tensors, *printed, *adapter.inputs):
            assert spec.locate(mapping.concrete(0)) is not None, (family_name, mapping)
        for mapping in printed:
            assert spec.locate(mapping.stage).stage.kind == "document"
        assert set(adapter.unexposed) <= {stage.name for stage in spec.stages}
    if adapter.port is not None:
        options = adapter.check_options({}, name)
        assert adapter.files(options) == [str(Path(options["root"]) / product)
                                          for product in adapter.port.products]


def test_the_family_port_serves_every_family_and_runs_no_commands():
    ours = load_adapter("audioparity")
    assert ours.family_port and set(ours.families) == set(registered_families())
    with pytest.raises(AudioparityError, match="has no commands to run"):
        ours.run(ToolCall(Path("m"), Path("c"), Path("o"), family("parakeet_tdt").spec, {}, {},
                          "f32", "cpu", 1, None))


BASE = {"name": "mine", "title": "mine", "families": ("parakeet_tdt",), "output": "f32json",
        "weight_types": ("f32",)}


@pytest.mark.parametrize("fields, message", [
    ({"tensors": (TensorMap("enc", "encoder_out"),)},
     "TensorMap 'enc' maps onto 'encoder_out', no stage of parakeet_tdt; expected one of "
     "mel_features"),
    ({"unexposed": {"layer_3": "why"}},
     "names 'layer_3' as unexposed, no stage of parakeet_tdt"),
    ({"output": "wav"}, "output 'wav'; expected one of dump, f32json, npy, tokens"),
    ({"inputs": (TensorMap("pre.raw", "pre_encode"),)},
     "inputs ['pre_encode'] from a reference it does not read"),
    ({"inputs": (TensorMap("pre.raw", "pre_encoder"),), "reads_reference": True},
     "TensorMap 'pre.raw' maps onto 'pre_encoder', no stage of parakeet_tdt"),
    ({"converts": True}, "converts is set but convert is not defined"),
    ({"printed": TensorMap("stdout", "decode")}, "printed is set but parse is not defined"),
    ({"output": "tokens"}, "output 'tokens' and nothing printed"),
    ({"tensors": (TensorMap("d", "decode"),)}, "maps a .f32 file onto the document 'decode'"),
    ({"families": ("wav2vec",)}, "unknown family 'wav2vec'"),
    ({"title": ""}, "has no name or no title"),
])
def test_an_adapter_whose_declarations_do_not_hold_is_refused_in_one_line(fields, message):
    with pytest.raises(AudioparityError, match="^mine.py: ") as err:
        check_adapter(Adapter(**{**BASE, **fields}), "mine.py")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_field_is_refused():
    with pytest.raises(TypeError, match=r"unknown field\(s\) \['wieght_types'\]"):
        Adapter(wieght_types=("f32",))


# --- a user's adapter --------------------------------------------------------------------------


def reference_dump(path: Path) -> Path:
    """A stand-in reference dump of the clip: enc_out and the decode my.cpp prints."""
    with DumpWriter(path, producer="nemo", fields={"family": "parakeet_tdt"}) as writer:
        writer.add_tensor("enc_out", np.ones((3, 4), np.float32), "[T, D]")
        writer.add_json("decode", {"ids": [3, 5], "frames": [0, 2], "durations": [1, 0],
                                   "text": ""})
    return path


def test_a_users_adapter_named_by_path_runs_through_the_cli(tmp_path, monkeypatch, capsys,
                                                            clip_wav):
    """``--adapter ports/my_port.py``, relative to the working directory: its decode is read,
    the stage it names gets its reason in the cell, the others "does not expose it", and the
    run's wall time is its last stage's seconds."""
    from audioparity.compare.cell import compare_cell
    from audioparity.compare.plan import CellDumps

    monkeypatch.chdir(tmp_path)
    write(tmp_path / "ports/my_port.py", MY_PORT)
    (tmp_path / "model.nemo").write_bytes(b"")
    adapter = load_adapter("ports/my_port.py")
    assert type(adapter).__name__ == "MyPort" and adapter.name == "my_cpp"
    assert load_adapter("ports/my_port.py") is adapter
    code, _, err = run_cli(["candidate", "run", "--family", "parakeet_tdt", "--adapter",
                            "ports/my_port.py", "--model", "model.nemo", "--audio",
                            str(clip_wav), "--output-dir", "dump", "--weight-type", "f32"],
                           capsys)
    assert code == 0, err
    dump = Dump(tmp_path / "dump")
    assert dump.status == "ok" and dump.json("decode")["ids"] == [3, 5]
    assert dump.manifest["candidate_adapter"] == "my_cpp"
    reasons = dump.manifest["not_exposed"]
    assert reasons["enc_out"] == ("my.cpp does not expose it: its encoder output lives in a "
                                  "fused kernel")
    assert reasons["mel_features"] == "my.cpp does not expose it"
    seconds = dump.manifest["seconds"]
    assert seconds["run_wall"] > 0 and seconds["decode"] == seconds["run_wall"]
    assert any(note.startswith("seconds: run_wall is the wall time of the tool's 1 command(s)")
               for note in dump.manifest["notes"])
    gates = {"gates": [{"stage": "decode", "exact": True, "from": "default"},
                       {"stage": "*", "cosine_min": 0.99, "from": "default"}],
             "expected_failures": []}
    compare_cell(CellDumps(reference_dump(tmp_path / "ref"), tmp_path / "dump"), gates,
                 {"family": "parakeet_tdt"}, tmp_path / "cell.json")
    rows = {r["stage"]: r for r in json.loads((tmp_path / "cell.json").read_text())}
    assert rows["decode"]["status"] == "pass"
    assert rows["decode"]["seconds"] == seconds["run_wall"]
    assert (rows["enc_out"]["status"], rows["enc_out"]["reason"]) == (
        "unavailable", reasons["enc_out"])
    assert rows["enc_out"]["seconds"] is None


def test_a_folder_given_as_an_adapter_is_named_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ports").mkdir()
    with pytest.raises(AudioparityError, match=r"^adapter 'ports/': a folder: .*ports \(a path"):
        load_adapter("ports/")


@pytest.mark.parametrize("text, found", [
    (None, "no such file"),
    ("x = 1\n", "defines no Adapter; expected a .py file that defines one Adapter subclass"),
    ("from audioparity.candidates import Adapter\nclass A(Adapter): pass\n"
     "class B(Adapter): pass\n", "defines 2 Adapter subclasses"),
    ("import not_a_module_here\n",
     "importing ports/bad.py failed: ModuleNotFoundError: No module named 'not_a_module_here'"),
    ("from audioparity.candidates import Adapter\nclass A(Adapter):\n    title = 'a'\n",
     "adapter A has no name or no title"),
])
def test_a_bad_adapter_file_is_one_error_line(tmp_path, monkeypatch, capsys, text, found):
    monkeypatch.chdir(tmp_path)
    if text is not None:
        write(tmp_path / "ports/bad.py", text)
    with pytest.raises(AudioparityError) as err:
        load_adapter("ports/bad.py")
    message = str(err.value).replace(str(tmp_path) + "/", "")
    assert message.startswith("adapter 'ports/bad.py'") or message.startswith("ports/bad.py")
    assert found in message and "\n" not in message
    code, out, stderr = run_cli(["candidate", "convert", "--adapter", "ports/bad.py",
                                 "--model", "m", "--weight-type", "f32", "--output-dir", "o"],
                                capsys)
    assert (code, out) == (1, "")
    assert found in stderr.splitlines()[-1].replace(str(tmp_path) + "/", "")
    assert not (tmp_path / "o").exists()


def test_an_unknown_name_says_where_it_was_looked_for():
    with pytest.raises(AudioparityError) as err:
        load_adapter("my_cpp")
    assert str(err.value).startswith(
        "unknown adapter 'my_cpp': not one of the shipped adapters (audioparity, command, ")
    assert "not a path to a .py file, and no entry point 'my_cpp' in the group " \
           "audioparity.adapters" in str(err.value)


def installed(folder: Path, entry: str) -> Path:
    """A distribution installed in ``folder`` (put it on ``sys.path``) whose
    ``audioparity.adapters`` entry point ``my_ep`` is ``entry``, and its module my_ep_port."""
    write(folder / "my_ep_port.py", MY_PORT + "\n\nINSTANCE = MyPort(title='my.cpp (entry)')\n")
    write(folder / "my_ep_port-1.0.dist-info/METADATA",
          "Metadata-Version: 2.1\nName: my-ep-port\nVersion: 1.0\n")
    write(folder / "my_ep_port-1.0.dist-info/entry_points.txt",
          f"[audioparity.adapters]\nmy_ep = {entry}\n")
    return folder


@pytest.mark.parametrize("entry, title", [("my_ep_port:MyPort", "my.cpp"),
                                          ("my_ep_port:INSTANCE", "my.cpp (entry)")])
def test_an_adapter_is_found_by_its_entry_point(tmp_path, monkeypatch, entry, title):
    monkeypatch.syspath_prepend(str(installed(tmp_path, entry)))
    monkeypatch.delitem(sys.modules, "my_ep_port", raising=False)
    adapter = load_adapter("my_ep")
    assert type(adapter).__name__ == "MyPort" and adapter.title == title
    assert adapter.name == "my_cpp"
    with pytest.raises(AudioparityError,
                       match=r"in the group audioparity.adapters; entry points: my_ep; "):
        load_adapter("my_other")


def test_an_entry_point_that_is_no_adapter_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(installed(tmp_path, "my_ep_port:sys")))
    monkeypatch.delitem(sys.modules, "my_ep_port", raising=False)
    with pytest.raises(AudioparityError, match=r"^adapter 'my_ep': entry point my_ep_port:sys "
                                               r"\(audioparity.adapters\): defines no Adapter"):
        load_adapter("my_ep")


# --- a tool that writes the contract itself (the `command` adapter) ----------------------------

#: A tool that writes a dump of the contract with one stage, or exits as told.
DUMP_TOOL = '''\
import sys
from pathlib import Path
import numpy as np
from audioparity.dumping.artifacts import DumpWriter
output = Path(sys.argv[sys.argv.index("--output-dir") + 1])
if "--fail" in sys.argv:
    sys.exit("my-dump: no model")
if "--write" in sys.argv:
    with DumpWriter(output, producer="my-dump", fields={"family": "parakeet_tdt"}) as writer:
        writer.add_tensor("enc_out", np.ones((3, 4), np.float32), "[T, D]")
'''


@pytest.mark.parametrize("flag, error", [
    ("--write", None),
    ("--fail", f"command on clip.wav: {Path(sys.executable).name} failed (exit code 1): "
               "my-dump: no model"),
    ("--quiet", "its commands exited 0 but wrote no dump/manifest.json"),
])
def test_a_command_tool_writes_the_dump_itself(tmp_path, monkeypatch, capsys, clip_wav, flag,
                                               error):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "my_dump.py", DUMP_TOOL)
    command = f"{sys.executable} my_dump.py --output-dir {{output}} {flag}"
    code, _, err = run_cli(["candidate", "run", "--family", "parakeet_tdt", "--adapter",
                            "command", "--options", json.dumps({"command": command}),
                            "--model", "m", "--audio", str(clip_wav), "--reference-dir", "ref",
                            "--output-dir", "dump", "--weight-type", "f32"], capsys)
    if error is None:
        assert code == 0, err
        assert Dump(tmp_path / "dump").tensor_names == ["enc_out"]
    else:
        assert code == 1 and error in err.splitlines()[-1]


# --- the family's own port ---------------------------------------------------------------------


@pytest.mark.slow
def test_the_family_port_runs_in_process_and_dumps_what_audioparity_ggml_dumps(
        fixture_model, clip_wav, tmp_path, capsys):
    """``candidate run --adapter audioparity`` (the family's options overridden by the
    entry's, the weights mapped from ``--weights-file``) and ``audioparity ggml`` give
    identical dumps."""
    from audioparity.dumping.driver import dump_reference

    model = fixture_model("whisper")
    whisper = family("whisper")
    dump_reference(whisper, model, [(clip_wav, tmp_path / "ref")], options={}, threads=1)
    common = ["--model", str(model), "--audio", str(clip_wav), "--reference-dir",
              str(tmp_path / "ref"), "--weight-type", "q8_0", "--weights-file",
              str(tmp_path / "w.gguf")]
    assert run_cli(["weights", "whisper", "--model", str(model), "--weight-type", "q8_0",
                    "--output", str(tmp_path / "w.gguf")], capsys)[0] == 0
    assert run_cli(["ggml", "whisper", *common, "--output-dir", str(tmp_path / "a")],
                   capsys)[0] == 0
    code, _, err = run_cli(["candidate", "run", "--family", "whisper", "--adapter",
                            "audioparity", *common, "--output-dir", str(tmp_path / "b")],
                           capsys)
    assert code == 0, err
    code, out, _ = run_cli(["determinism", "compare", str(tmp_path / "a"), str(tmp_path / "b")],
                           capsys)
    assert code == 0 and out.startswith("identical:")
    code, _, err = run_cli(["candidate", "run", "--family", "whisper", "--adapter",
                            "audioparity", "--options", '{"nope": 1}', *common, "--output-dir",
                            str(tmp_path / "c")], capsys)
    assert code == 1 and "adapter 'audioparity' options" in err.splitlines()[-1]
    assert not (tmp_path / "c").exists()


def test_the_adapter_docs_candidates_md_shows_loads_by_path_and_gives_its_commands(
        tmp_path, monkeypatch):
    """The example of docs/candidates.md ("an adapter of your own"), saved as
    ports/my_port.py, is loaded, checked and run as written."""
    from tests import REPO

    text = (REPO / "docs/candidates.md").read_text()
    section = text[text.index("### 2. Your tool writes its own files"):]
    example = section[section.index("```python\n") + 10:section.index("```\n", 1)]
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "ports/my_port.py", example)
    adapter = load_adapter("ports/my_port.py")
    assert (adapter.name, type(adapter).__name__) == ("my_cpp", "MyCpp")
    options = adapter.check_options({}, "my.cpp")
    assert adapter.files(options) == [".ports/my_cpp/build/bin/my-cli",
                                      ".ports/my_cpp/scripts/convert.py"]
    (convert,) = adapter.convert(Path("m.nemo"), "q8_0", Path("out"), options=options)
    assert convert[1:] == [".ports/my_cpp/scripts/convert.py", "m.nemo", "out/model-q8_0.gguf"]
    ((argv, env),) = adapter.run(ToolCall(Path("out"), Path("a.wav"), Path("raw"),
                                          family("parakeet_tdt").spec, {}, options, "q8_0", "cpu",
                                          1, None))
    assert argv == [".ports/my_cpp/build/bin/my-cli", "-m", "out/model-q8_0.gguf", "--dump",
                    "raw", "a.wav"] and env == {}
    assert adapter.unavailable("pos_emb") == (
        "my.cpp does not expose it: my.cpp folds the positions into its attention kernel")
    assert adapter.cannot_run(options, "f16", "cpu").startswith("my.cpp has no weight type f16")
