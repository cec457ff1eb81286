"""The llama.cpp MOSS candidate's pieces that run without llama.cpp: the pre-tokenizer answer
given to its converter, the Qwen3 re-layout of a MOSS checkpoint, and why its cells lack stages."""

from __future__ import annotations

import json

import numpy as np
import pytest

from audioparity.candidates import llama_cpp_convert as convert
from audioparity.candidates import load_adapter
from audioparity.candidates.reading import not_exposed
from audioparity.dumping.artifacts import DumpWriter
from audioparity.models.registry import family


def tokenizer(tmp_path, regex=convert.QWEN2_SPLIT, add_prefix_space=False):
    """A tokenizer.json whose pre-tokenizer is Qwen2's, or one changed."""
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
         "use_regex": False}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps({"pre_tokenizer": pre}))
    return tmp_path


def test_qwen2s_pre_tokenizer_is_recognised_and_nothing_else(tmp_path):
    # the regex as Qwen/Qwen2-7B's tokenizer.json writes it (an independent copy)
    qwen2 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}"
             "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    assert convert.qwen2_pre_tokenizer(tokenizer(tmp_path, regex=qwen2))
    assert not convert.qwen2_pre_tokenizer(tokenizer(tmp_path, regex=qwen2.replace("?i:", "")))
    assert not convert.qwen2_pre_tokenizer(tokenizer(tmp_path, add_prefix_space=True))


def test_the_backbone_is_re_laid_as_qwen3_bytes_unchanged(tmp_path, moss_model):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    convert.relayout(moss_model, tmp_path / "qwen3")
    config = json.loads((tmp_path / "qwen3/config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    original = load_file(moss_model / "model.safetensors")
    laid = load_file(tmp_path / "qwen3/model.safetensors")
    assert set(laid) == {"model." + k.removeprefix("language_model.") for k in original
                         if k.startswith("language_model.")} | {"lm_head.weight"}
    assert torch.equal(laid["lm_head.weight"], original["lm_heads.0.weight"])
    name = "model.layers.1.self_attn.k_norm.weight"
    assert np.array_equal(laid[name].float().numpy(),
                          original["language_" + name].float().numpy())


def test_its_input_embeddings_are_named_as_its_input_and_the_audio_heads_as_the_hosts(tmp_path):
    adapter = load_adapter("llama_cpp")
    with DumpWriter(tmp_path / "dump", producer="llama_cpp",
                    fields={"family": "moss_voicegen"}) as writer:
        writer.add_tensor("last_hidden", np.zeros(4, np.float32), "[H]")
        not_exposed(writer, adapter, family("moss_voicegen").spec)
    reasons = writer.manifest["not_exposed"]
    assert reasons["input_embeddings"] == (
        f"{adapter.title} takes it from the reference as its input")
    host = ("llama.cpp does not expose it: it runs the Qwen3 backbone only, fed the reference's "
            "input embeddings; the prompt's rows, the codebook embeddings and the audio heads "
            "are not Qwen3 parts and stay on the host")
    assert reasons["audio_logits"] == reasons["prompt"] == reasons["generation"] == host
