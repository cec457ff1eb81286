"""The third-party ports at the quantized types people ship, through their own quantizers
(transcribe-quantize's presets, whisper.cpp's parakeet-quantize and whisper-quantize,
llama-quantize --pure), and the storage each cell records of the model file it reads: bits per
weight, tensors per type, the matmul weights stored as another type than the cell's (the
fallbacks). Without the ports: the commands, the readers and the record on files written here;
with the built ports (`make ports`): the trained Parakeet and the MOSS fixture converted at q4_0
and q4_K, each file checked against what the tool itself printed and against its size."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from audioparity.candidates import Adapter, load_adapter, running
from audioparity.candidates.model_file import (
    ggml_bin_tensors,
    model_storage,
    storage_of,
    unfilled,
)
from audioparity.candidates.whisper_cpp import PARAKEET_HEADER
from audioparity.candidates.whisper_cpp_whisper import WHISPER_HEADER
from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import MIXES
from audioparity.dumping.driver import RunSettings
from audioparity.dumping.weight_files import StoredTensor
from tests import RESOURCES

REPO = Path(__file__).resolve().parents[2]
PORTS = REPO / ".ports"
#: The trained default Parakeet (d_model 256, prediction and joint 128).
ESPEAK = RESOURCES / "models/parakeet-tdt-espeak/model.nemo"
TRANSCRIBE = {"root": "/p/t", "profile": "parakeet-tdt-0.6b-v2"}

#: ggml's block layouts (ggml-common.h: block_q4_0 is an f16 scale and 16 bytes of nibbles for
#: 32 values, block_q4_K 2 + 2 f16, 12 bytes of scales and 128 of nibbles for 256, ...), written
#: out here rather than taken from gguf: (values per block, bytes per block).
BLOCKS = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18),
          "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q4_K": (256, 144),
          "q5_K": (256, 176), "q6_K": (256, 210), "q2_K": (256, 84), "q3_K": (256, 110)}
#: ggml's type numbers (enum ggml_type) of those, for the legacy files written here.
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8, "q4_K": 12}


def nbytes(kind: str, shape: tuple[int, ...]) -> int:
    block, size = BLOCKS[kind]
    return int(np.prod(shape[:-1], dtype=np.int64)) * (shape[-1] // block * size) if shape \
        else size


def bits_per_weight(tensors) -> float:
    """Over ``(type, shape)`` pairs, from :data:`BLOCKS`."""
    values = sum(int(np.prod(shape, dtype=np.int64)) for _, shape in tensors)
    return round(sum(nbytes(kind, shape) * 8 for kind, shape in tensors) / values, 4)


# -- without the ports ------------------------------------------------------------------------


def legacy_file(path: Path, tensors, header: bytes) -> Path:
    """A legacy ggml file: the magic, ``header``, then each ``(name, type, shape)`` record with
    zero data of its size (ne reversed from the numpy shape)."""
    out = bytearray(struct.pack("<I", 0x67676D6C) + header)
    for name, kind, shape in tensors:
        ne = list(reversed(shape))
        out += struct.pack(f"<3i{len(ne)}i", len(ne), len(name), GGML_TYPES[kind], *ne)
        out += name.encode() + bytes(nbytes(kind, shape))
    path.write_bytes(bytes(out))
    return path


def parakeet_header() -> bytes:
    """15 hyperparameters (13: two durations), a 2 x 3 filter bank, a window of 4, the
    durations, a vocabulary of two pieces."""
    hparams = [0] * 15
    hparams[13] = 2
    return (struct.pack("<15i", *hparams) + struct.pack("<2i6f", 2, 3, *range(6))
            + struct.pack("<i4f", 4, *range(4)) + struct.pack("<2I", 0, 1)
            + struct.pack("<i", 2) + struct.pack("<i1s", 1, b"a") + struct.pack("<i2s", 2, b"bc"))


TENSORS = [("enc.weight", "q4_0", (3, 64)), ("enc.bias", "f32", (3,)),
           ("pos_bias_u", "f32", (4, 8)), ("steps", "f32", ()), ("joint.weight", "f16", (5, 48))]


def test_a_legacy_ggml_file_is_read_through_its_headers_layout(tmp_path):
    path = legacy_file(tmp_path / "p.bin", TENSORS, parakeet_header())
    assert ggml_bin_tensors(path, PARAKEET_HEADER) == [
        StoredTensor(name, shape, kind) for name, kind, shape in TENSORS]
    whisper = (struct.pack("<11i", *range(11)) + struct.pack("<2i4f", 2, 2, *range(4))
               + struct.pack("<i", 1) + struct.pack("<i3s", 3, b"abc"))
    path = legacy_file(tmp_path / "w.bin", TENSORS[:2], whisper)
    assert [t.name for t in ggml_bin_tensors(path, WHISPER_HEADER)] == ["enc.weight", "enc.bias"]


@pytest.mark.parametrize("damage, match", [
    (lambda data: data[:-3], "'joint.weight' \\[48, 5\\] runs past the end"),
    (lambda data: b"GGUF" + data[4:], "no ggml magic"),
    (lambda data: data[:40], "a field runs past the end"),
])
def test_a_truncated_or_foreign_file_is_refused_in_one_line(tmp_path, damage, match):
    path = legacy_file(tmp_path / "p.bin", TENSORS, parakeet_header())
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(AudioparityError, match=match):
        ggml_bin_tensors(path, PARAKEET_HEADER)


def test_the_record_counts_every_tensors_bits_and_names_each_fallback_with_why():
    adapter = Adapter(title="my.cpp", unquantized=(r".*pos_bias_u",))
    tensors = [StoredTensor("a.weight", (8, 256), "q4_K"),  # as asked
               StoredTensor("b.weight", (4, 128), "q8_0"),  # rows of 128: a fallback
               StoredTensor("c.weight", (4, 256), "q8_0"),  # rows fit: the tool's choice
               StoredTensor("c.bias", (4,), "f32"),  # 1-D: not a matmul weight
               StoredTensor("x.pos_bias_u", (4, 8), "f32"),  # kept by name
               StoredTensor("conv.weight", (4, 1, 3), "f16")]  # 3-D: a kernel
    record = storage_of(tensors, lambda t: adapter.requested_type(t, "q4_K", {}), "my.cpp")
    assert record == {
        "bits_per_weight": bits_per_weight([(t.type, t.shape) for t in tensors]),
        "types": {"f16": 1, "f32": 2, "q4_K": 1, "q8_0": 2},
        "fallbacks": ["b.weight [4, 128]: q4_K -> q8_0 (rows of 128 values, blocks of 256)",
                      "c.weight [4, 256]: q4_K -> q8_0 (its rows fit the blocks: my.cpp's "
                      "choice)"]}
    assert record["bits_per_weight"] == round((2048 * 4.5 + 1536 * 8.5 + 36 * 32 + 12 * 16)
                                              / 3632, 4)


def test_rows_a_quantizer_stored_without_filling_its_blocks_are_named():
    tensors = [StoredTensor("q.weight", (384, 384), "q4_K"), StoredTensor("k.weight", (8, 384),
                                                                          "q4_K"),
               StoredTensor("fc.weight", (384, 1536), "q4_K"), StoredTensor("b", (384,), "f32")]
    assert unfilled(tensors) == [
        "2 tensor(s) stored q4_K in rows of 384 values, which do not fill its blocks of 256, so "
        "ggml cannot use them: q.weight, k.weight"]


def test_transcribe_quantizes_each_type_with_its_preset(tmp_path):
    adapter = load_adapter("transcribe_cpp")
    presets = {kind: adapter.convert(tmp_path / "m.nemo", kind, tmp_path / "out",
                                     options=TRANSCRIBE)[-1][-1]
               for kind in adapter.weight_types if kind != "f32"}
    assert presets == {"f16": "F16", "q8_0": "Q8_0", "q6_K": "Q6_K", "q5_1": "Q5_1",
                       "q5_0": "Q5_0", "q5_K_M": "Q5_K_M", "q4_1": "Q4_1", "q4_0": "Q4_0",
                       "q4_K_M": "Q4_K_M"}
    assert adapter.model_files(tmp_path / "out", TRANSCRIBE, "q4_K_M") == [
        tmp_path / "out/models/parakeet-tdt-0.6b-v2/model-q4_K_M.gguf"]
    # its k-quants below q6_K are mixes only: a uniform q4_K cell says which
    assert adapter.cannot_run(TRANSCRIBE, "q4_K", "cpu") == (
        "transcribe.cpp has no uniform q4_K: its preset Q4_K_M is the mix q4_K_M")


@pytest.mark.parametrize("name", ["whisper_cpp", "whisper_cpp_whisper"])
def test_whisper_cpp_quantizes_with_its_ftype_names(tmp_path, name):
    adapter = load_adapter(name)
    assert adapter.weight_types == ("f32", "f16", "q8_0", "q6_K", "q5_1", "q5_0", "q5_K", "q4_1",
                                    "q4_0", "q4_K", "q3_K", "q2_K")
    model = tmp_path / "hf"
    model.mkdir()
    for file in ("vocab.json", "added_tokens.json", "config.json"):
        (model / file).write_text("{}")
    *_, quantize = adapter.convert(model, "q4_K", tmp_path / "out", options={"root": "/w"})
    assert quantize[-1] == "q4_k"
    assert [quantize[-2]] == list(map(str, adapter.model_files(tmp_path / "out", {}, "q4_K")))


LLAMA = {"root": "/l"}


def test_llama_cpp_converts_its_own_types_and_quantizes_the_others_pure(tmp_path):
    """Its converter's types; llama-quantize's with --pure for a type, without for a mix."""
    adapter = load_adapter("llama_cpp")
    assert set(adapter.weight_types) == {"f32", "f16", "bf16", "q8_0", "q6_K", "q5_1", "q5_0",
                                         "q5_K", "q4_1", "q4_0", "q4_K", "iq4_nl", "mxfp4",
                                         "q3_K", "q2_K", *MIXES}
    options = adapter.check_options(LLAMA, "options")
    (q8,) = adapter.convert(tmp_path / "moss", "q8_0", tmp_path / "out", options=options)
    assert q8[q8.index("--outtype") + 1] == "q8_0"
    convert, quantize = adapter.convert(tmp_path / "moss", "q4_K", tmp_path / "out",
                                        options=options)
    assert convert[convert.index("--outtype") + 1] == "f32"
    assert quantize == ["/l/build/bin/llama-quantize", "--pure",
                        str(tmp_path / "out/model-f32.gguf"), str(tmp_path / "out/model-q4_K.gguf"),
                        "Q4_K"]
    assert adapter.convert(tmp_path / "m", "mxfp4", tmp_path / "o",
                           options=options)[-1][-1] == "MXFP4_MOE"
    _, mix = adapter.convert(tmp_path / "moss", "q4_K_M", tmp_path / "out", options=options)
    assert mix == ["/l/build/bin/llama-quantize", str(tmp_path / "out/model-f32.gguf"),
                   str(tmp_path / "out/model-q4_K_M.gguf"), "Q4_K_M"]


def test_llama_cpps_tensor_types_become_its_tensor_type_pairs_and_the_requested_types(tmp_path):
    adapter = load_adapter("llama_cpp")
    options = adapter.check_options({**LLAMA, "tensor_types": {"ffn_down": "q8_0",
                                                               r"attn_(q|k)": "q6_K"}}, "o")
    convert, quantize = adapter.convert(tmp_path / "moss", "q8_0", tmp_path / "out",
                                        options=options)
    assert convert[convert.index("--outtype") + 1] == "f32"  # q8_0 too, through the quantizer
    assert quantize[1:6] == ["--pure", "--tensor-type", "ffn_down=q8_0", "--tensor-type",
                             "attn_(q|k)=q6_K"]
    asked = {name: adapter.requested_type(StoredTensor(name, (64, 64), "f32"), "q4_0", options)
             for name in ("blk.0.ffn_down.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight")}
    assert asked == {"blk.0.ffn_down.weight": "q8_0", "blk.0.attn_k.weight": "q6_K",
                     "blk.0.attn_v.weight": "q4_0"}
    with pytest.raises(AudioparityError, match="applies --tensor-type over a quantized type only"):
        adapter.convert(tmp_path / "moss", "f16", tmp_path / "out", options=options)


@pytest.mark.parametrize("tensor_types, match", [
    ({"ffn": "q4_X"}, r"\['tensor_types'\]\['ffn'\]: 'q4_X'; expected a pattern to one of"),
    ({"(ffn": "q4_0"}, "is not a regular expression"),
    (["ffn"], r"\['tensor_types'\]: \['ffn'\]; expected dict"),
])
def test_llama_cpps_tensor_types_are_checked(tensor_types, match):
    with pytest.raises(AudioparityError, match=match):
        load_adapter("llama_cpp").check_options({"tensor_types": tensor_types}, "options")


# -- with the built ports ---------------------------------------------------------------------


def built(name: str) -> Adapter:
    """The adapter, its port built (`make ports`), or skip (fail with
    AUDIOPARITY_REQUIRE_PORTS)."""
    adapter = load_adapter(name)
    root = PORTS / name
    if not all((root / product).is_file() for product in adapter.port.products):
        message = f"{root} is not built with {', '.join(adapter.port.products)}: make ports"
        if os.environ.get("AUDIOPARITY_REQUIRE_PORTS"):
            pytest.fail(message)
        pytest.skip(message)
    return adapter


def converted(adapter: Adapter, model: Path, folder: Path, weight_types) -> dict[str, str]:
    """``model`` converted into ``folder`` at each weight type by the adapter's own commands
    (the converter's, shared by the types, once); what each type's last command printed."""
    options = adapter.check_options({"root": str(PORTS / adapter.name)}, "options")
    done, printed = set(), {}
    folder.mkdir(parents=True, exist_ok=True)
    for kind in weight_types:
        for argv in adapter.convert(model, kind, folder, options=options):
            if tuple(argv) not in done:
                stdout, stderr = running.run_tool(argv, {}, f"{adapter.name} {kind}", echo=False)
                done.add(tuple(argv))
                printed[kind] = stdout + stderr
    return printed


def gguf_types(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's type and numpy shape, as gguf reads them."""
    import gguf

    return {t.name: (t.tensor_type.name.lower().replace("_k", "_K"),
                     tuple(int(n) for n in reversed(t.shape)))
            for t in gguf.GGUFReader(str(path)).tensors}


def check_gguf_size(path: Path, tensors) -> None:
    """The file's tensor data is the sum of the tensors' sizes from :data:`BLOCKS`, plus at
    most the alignment (32 bytes) of padding after each."""
    import gguf

    start = gguf.GGUFReader(str(path)).data_offset
    data = path.stat().st_size - start
    sizes = sum(nbytes(kind, shape) for kind, shape in tensors.values())
    assert sizes <= data < sizes + 32 * len(tensors)


def stored_file(adapter, folder: Path, options: dict, kind: str) -> tuple[dict, dict, list]:
    """The tensors of the port's model file at ``kind`` (its size checked against them), and
    the storage record and notes the cell takes from it."""
    (path,) = adapter.model_files(folder, options, kind)
    tensors = gguf_types(path)
    check_gguf_size(path, tensors)
    record, _, notes = model_storage(adapter, folder, options, kind)
    return tensors, record, notes


@pytest.fixture(scope="module")
def transcribe(tmp_path_factory):
    adapter = built("transcribe_cpp")
    folder = tmp_path_factory.mktemp("transcribe")
    printed = converted(adapter, ESPEAK, folder, ["q4_0", "q4_K_M"])
    return adapter, folder, printed


def test_transcribe_stores_the_trained_parakeet_at_q4_0_and_q4_k_m_as_its_presets_say(
        transcribe):
    adapter, folder, printed = transcribe
    options = adapter.check_options({}, "options")
    for kind in ("q4_0", "q4_K_M"):
        tensors, record, notes = stored_file(adapter, folder, options, kind)
        # its own summary of the output: "  q4_0        27        1.9"
        summary = printed[kind].split("output tensor types:")[1].split("processed:")[0]
        told = {m[1]: int(m[2]) for m in re.finditer(r"^\s+(\w+)\s+(\d+)\s+[\d.]+$", summary,
                                                     re.MULTILINE)}
        assert record["types"] == told and notes == []
        assert record["bits_per_weight"] == bits_per_weight(tensors.values())
        matmul = {name for name, (_, shape) in tensors.items()
                  if len(shape) == 2 and "pos_bias" not in name}
        stored = {name: tensors[name][0] for name in matmul}
        # the 1x1 convolutions (3-D) stay f16 in every preset, not among the matmul weights
        assert {tensors[n][0] for n in tensors if ".conv.pointwise" in n} == {"f16"}
        if kind == "q4_0":
            assert set(stored.values()) == {"q4_0"} and record["fallbacks"] == []
            continue
        # Q4_K_M: its attention output q8_0 by recipe; the prediction net and the joint's
        # 128-wide rows cannot be q4_K (blocks of 256): its q8_0 fallback
        narrow = {n for n in matmul if tensors[n][1][-1] == 128}
        recipe = {n for n in matmul if n.endswith("attn.linear_out.weight")}
        assert narrow == {"pred.embed.weight", "pred.lstm.0.Wx", "pred.lstm.0.Wh",
                          "pred.lstm.1.Wx", "pred.lstm.1.Wh", "joint.pred.weight",
                          "joint.out.weight"} and len(recipe) == 2
        assert {n for n, t in stored.items() if t != "q4_K"} == narrow | recipe
        assert {stored[n] for n in narrow | recipe} == {"q8_0"}
        assert sorted(record["fallbacks"]) == sorted(
            [f"{n} {list(tensors[n][1])}: q4_K -> q8_0 (rows of 128 values, blocks of 256)"
             for n in narrow]
            + [f"{n} {list(tensors[n][1])}: q4_K -> q8_0 (its rows fit the blocks: "
               "transcribe.cpp's choice)" for n in recipe])


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    adapter = built("whisper_cpp")
    folder = tmp_path_factory.mktemp("whisper")
    printed = converted(adapter, ESPEAK, folder, ["q4_0", "q4_K"])
    return adapter, folder, printed


#: A tensor's line in parakeet-quantize's log: its name, its ne, its type, and "-> size" when
#: it quantized it.
QUANTIZE_LINE = re.compile(r"^\s*(\S+) - \[\s*(\d+),\s*(\d+),\s*(\d+)\], type =\s*(\w+) "
                           r"size =\s*[\d.]+ MB( ->)?", re.MULTILINE)


def test_whisper_cpp_stores_the_trained_parakeet_at_q4_0_and_q4_k_as_its_log_says(whisper):
    adapter, folder, printed = whisper
    (f32,) = (p.stat().st_size for p in adapter.model_files(folder, {}, "f32"))
    for kind in ("q4_0", "q4_K"):
        record, _, notes = model_storage(adapter, folder, {}, kind)
        logged = {m[1]: (kind if m[6] else m[5], (int(m[2]), int(m[3]), int(m[4])))
                  for m in QUANTIZE_LINE.finditer(printed[kind])}
        (path,) = adapter.model_files(folder, {}, kind)
        tensors = {t.name: t for t in adapter.model_tensors(path)}
        assert {name: t.type for name, t in tensors.items()} == {
            name: told for name, (told, _) in logged.items()}
        assert record["bits_per_weight"] == bits_per_weight(
            [(t.type, t.shape) for t in tensors.values()])
        # the files differ from the f32 file by their tensors' data alone (same header, names)
        assert f32 - path.stat().st_size == sum(
            nbytes("f32", t.shape) - nbytes(t.type, t.shape) for t in tensors.values())
        assert notes == []
        # at a k-quant it keeps the prediction tensors f32, the 128 rows not filling blocks of 256
        kept = sorted(name for name, t in tensors.items() if len(t.shape) == 2
                      and t.type == "f32" and "pos_bias" not in name
                      and "depthwise" not in name)
        if kind == "q4_0":
            assert kept == [] and record["fallbacks"] == []
        else:
            assert kept == sorted(["decoder.prediction.embed.weight", "joint.pred.weight",
                                   "joint.joint_net.2.weight", *(
                                       f"decoder.prediction.dec_rnn.lstm.weight_{w}_l{i}"
                                       for w in ("ih", "hh") for i in (0, 1))])
            assert sorted(record["fallbacks"]) == sorted(
                f"{n} {list(tensors[n].shape)}: q4_K -> f32 (rows of 128 values, blocks of 256)"
                for n in kept)


def test_a_cell_of_a_quantized_port_carries_its_storage_in_its_manifest(whisper, clip_wav,
                                                                       tmp_path):
    adapter, folder, _ = whisper
    options = {"root": str(PORTS / adapter.name)}
    running.run_candidate(running.CandidateEntry(adapter.name, "parakeet_tdt"), folder, clip_wav,
                          tmp_path / "dump", RunSettings("q4_K", "cpu", options))
    manifest = json.loads((tmp_path / "dump/manifest.json").read_text())
    assert manifest["status"] == "ok"
    assert manifest["storage"] == model_storage(adapter, folder, options, "q4_K")[0]
    assert len(manifest["storage"]["fallbacks"]) == 7


@pytest.fixture(scope="module")
def llama(tmp_path_factory, moss_model):
    adapter = built("llama_cpp")
    folder = tmp_path_factory.mktemp("llama")
    printed = converted(adapter, moss_model, folder, ["q4_0", "q4_K"])
    return adapter, folder, printed


def test_llama_quantize_stores_the_moss_fixture_uniformly_and_its_fallbacks_are_recorded(llama):
    adapter, folder, printed = llama
    options = adapter.check_options({}, "options")
    for kind in ("q4_0", "q4_K"):
        tensors, record, notes = stored_file(adapter, folder, options, kind)
        assert record["bits_per_weight"] == bits_per_weight(tensors.values()) and notes == []
        matmul = {name: kind_ for name, (kind_, shape) in tensors.items() if len(shape) == 2}
        assert len(matmul) == 16 and record["types"] == {"f32": 9, kind if kind == "q4_0"
                                                         else "q5_0": 16}
        # its log: "warning: blk.0.ffn_down.weight - ncols 160 not divisible by 256 (required
        # for type q4_K) -> falling back to q5_0"
        fell = dict(re.findall(r"warning: (\S+)\s+- ncols.*falling back to\s+(\w+)",
                               printed[kind]))
        if kind == "q4_0":  # the fixture's rows (64, 160) fill blocks of 32
            assert set(matmul.values()) == {"q4_0"} and fell == {} and record["fallbacks"] == []
        else:  # but not blocks of 256: --pure, then its q5_0 fallback for every one
            assert fell == dict.fromkeys(matmul, "q5_0")
            assert sorted(record["fallbacks"]) == sorted(
                f"{name} {list(tensors[name][1])}: q4_K -> q5_0 (rows of "
                f"{tensors[name][1][-1]} values, blocks of 256)" for name in matmul)


def test_llama_quantize_takes_a_recipes_tensor_types(llama, moss_model, tmp_path):
    adapter, _, _ = llama
    options = adapter.check_options({"root": str(PORTS / adapter.name),
                                     "tensor_types": {"ffn_down": "q8_0"}}, "options")
    running.convert(adapter.name, moss_model, "q4_0", tmp_path / "q4_0", options)
    record, *_ = model_storage(adapter, tmp_path / "q4_0", options, "q4_0")
    assert record["types"] == {"f32": 9, "q4_0": 14, "q8_0": 2} and record["fallbacks"] == []


def test_a_recipe_is_written_in_llama_quantizes_syntax_and_its_file_honours_it(
        llama, moss_model, tmp_path):
    """A precision recipe (checkpoint names) becomes llama-quantize's --tensor-type of each
    overridden weight's GGUF name, matched whole; its file stores those weights as the recipe
    says (a codebook embedding, which llama.cpp does not hold, asks nothing of it), and the
    storage verdict with the recipe's overrides holds. transcribe.cpp's quantizer takes
    presets only: its recipe cells say so."""
    from audioparity.dumping.weight_files import Recipe, read_stored, storage_verdict

    adapter, _, _ = llama
    recipe = Recipe("recipe", "q4_0", {"language_model.layers.1.mlp.down_proj.weight": "q8_0",
                                       "lm_heads.0.weight": "q8_0", "emb_ext.0.weight": "q8_0"})
    options = adapter.check_options({"root": str(PORTS / adapter.name)}, "options")
    assert adapter.recipe_options(recipe, options)["tensor_types"] == {
        r"^blk\.1\.ffn_down\.weight$": "q8_0", r"^output\.weight$": "q8_0"}
    running.convert(adapter.name, moss_model, recipe, tmp_path / "r", options)
    stored = {name: t.type for name, t in read_stored(
        tmp_path / "r/audioparity-storage.gguf").items()}
    assert stored["language_model.layers.1.mlp.down_proj.weight"] == "q8_0"
    assert stored["language_model.layers.0.mlp.down_proj.weight"] == "q4_0"
    assert stored["lm_heads.0.weight"] == "q8_0"
    matmul = {name: [1, 64] for name, kind in stored.items() if kind != "f32"}
    honoured, line = storage_verdict("q4_0", matmul, stored, overrides=recipe.overrides)
    assert honoured, line
    transcribe = load_adapter("transcribe_cpp")
    _, _, why = running.port_cell(transcribe, TRANSCRIBE, recipe)
    assert why == ("transcribe.cpp's quantizer takes no type per tensor: it cannot write the "
                   "recipe q4_0+recipe")


@pytest.mark.slow
def test_whisper_cpps_k_quants_of_whisper_tiny_en_are_refused_by_its_own_loader(
        tmp_path, tiny_en_wheel, clip_wav):
    """whisper-quantize writes tiny.en's rows of 384 as q4_K (blocks of 256) without a fallback:
    the cell's notes name them, and whisper.cpp's loader refuses the file (a crashed cell); at
    q4_0 every matmul weight is q4_0."""
    from audioparity.cli import main
    from tests.candidates.test_whisper_cpp_whisper import reference_dump

    adapter = built("whisper_cpp_whisper")
    model = tmp_path / "hf"
    assert main(["convert-ct2", "--model-bin", str(tiny_en_wheel), "--output", str(model)]) == 0
    converted(adapter, model, tmp_path / "ggml", ["q4_0", "q4_K"])
    record, _, notes = model_storage(adapter, tmp_path / "ggml", {}, "q4_0")
    assert record["types"] == {"f16": 2, "f32": 100, "q4_0": 65} and record["fallbacks"] == []
    assert notes == []
    options = {"root": str(PORTS / adapter.name)}
    running.run_candidate(
        running.CandidateEntry(adapter.name, "whisper", {"language": "", "task": "transcribe"}),
        tmp_path / "ggml", clip_wav, tmp_path / "dump", RunSettings("q4_K", "cpu", options),
        reference_dump(tmp_path / "ref"))
    manifest = json.loads((tmp_path / "dump/manifest.json").read_text())
    assert manifest["status"] == "crashed"
    assert manifest["storage"]["types"] == {"f16": 2, "f32": 100, "q4_K": 65}
    assert any(note.startswith("storage: 57 tensor(s) stored q4_K in rows of 384 values")
               for note in manifest["notes"])
    assert "failed" in manifest["message"]

