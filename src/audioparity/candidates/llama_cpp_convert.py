"""The MOSS checkpoint's Qwen3 backbone as a GGUF made by llama.cpp's own converter.

``python llama_cpp_convert.py QWEN3_DIR OUTFILE --outtype T --llama-cpp DIR [--from-moss MOSS]``

1. With ``--from-moss``, re-lays the backbone as a Hugging Face Qwen3 directory in
   ``QWEN3_DIR`` (openmoss's converter re-lays it itself and runs only step 2): ``config.json`` is
   the checkpoint's ``language_config`` (architecture ``Qwen3ForCausalLM``), the weights are
   ``language_model.*`` as ``model.*`` and the text head ``lm_heads.0`` as ``lm_head``, bytes
   unchanged; the tokenizer files are copied. The codebook embeddings and audio heads are not
   Qwen3 parts and stay out.
2. Runs ``convert_hf_to_gguf.py`` of ``DIR`` (with its own ``gguf-py``) on it, unmodified but
   for one answer: its ``get_vocab_base_pre`` names a BPE pre-tokenizer by a hash of how a
   known tokenizer splits a test text, and a small locally trained tokenizer has no known
   hash. When the tokenizer's pre-tokenizer is exactly Qwen2's (its regex as Qwen2's
   ``tokenizer.json`` writes it, then byte-level), the answer is ``qwen2``; any other
   tokenizer goes to the converter's own check.

Runs as a script in its own process (the converter needs its ``gguf-py``, not the installed
``gguf``); exits 1 with one line on bad input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

#: The split regex of Qwen2's tokenizer.json (Qwen/Qwen2-7B), which llama.cpp's ``qwen2``
#: pre-tokenizer implements.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def relayout(moss_dir: Path, work: Path) -> None:
    """The Qwen3 directory of the checkpoint's backbone (module docstring, step 1)."""
    from safetensors.torch import load_file, save_file

    config = json.loads((moss_dir / "config.json").read_text())
    language = dict(config["language_config"])
    language.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                    torch_dtype=language.get("torch_dtype", config.get("torch_dtype")))
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.json").write_text(json.dumps(language, indent=1))
    weights = {}
    for path in sorted(moss_dir.glob("*.safetensors")):
        for name, tensor in load_file(path).items():
            if name.startswith("language_model."):
                weights["model." + name.removeprefix("language_model.")] = tensor
            elif name == "lm_heads.0.weight":
                weights["lm_head.weight"] = tensor
    if "lm_head.weight" not in weights or not any(k.startswith("model.layers.") for k in weights):
        raise SystemExit(f"llama_cpp_convert: {moss_dir}: no language_model.layers.* and "
                         "lm_heads.0 weights; expected a MOSS-TTS-Delay checkpoint")
    save_file({k: v.contiguous() for k, v in weights.items()}, work / "model.safetensors",
              metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        shutil.copy(moss_dir / name, work / name)


def qwen2_pre_tokenizer(work: Path) -> bool:
    """Whether the tokenizer's pre-tokenizer is Qwen2's: the split regex above, isolated,
    then byte-level without a prefix space."""
    pre = json.loads((work / "tokenizer.json").read_text()).get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [])
    return (pre.get("type") == "Sequence" and len(steps) == 2
            and steps[0].get("type") == "Split"
            and steps[0].get("pattern", {}).get("Regex") == QWEN2_SPLIT
            and steps[0].get("behavior") == "Isolated"
            and steps[1].get("type") == "ByteLevel" and not steps[1].get("add_prefix_space"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="the Qwen3 directory")
    parser.add_argument("outfile", type=Path)
    parser.add_argument("--outtype", required=True, choices=("f32", "f16", "bf16", "q8_0"))
    parser.add_argument("--llama-cpp", required=True, type=Path)
    parser.add_argument("--from-moss", type=Path, help="the MOSS checkpoint to re-lay first")
    args = parser.parse_args()
    if args.from_moss:
        relayout(args.from_moss, args.work)

    sys.path.insert(0, str(args.llama_cpp))
    import convert_hf_to_gguf  # noqa: PLC0415 (llama.cpp's, from --llama-cpp)
    from conversion.base import TextModel  # noqa: PLC0415

    own = TextModel.get_vocab_base_pre
    qwen2 = qwen2_pre_tokenizer(args.work)
    TextModel.get_vocab_base_pre = lambda self, tokenizer: (
        "qwen2" if qwen2 else own(self, tokenizer))
    sys.argv = ["convert_hf_to_gguf.py", str(args.work), "--outtype", args.outtype,
                "--outfile", str(args.outfile)]
    convert_hf_to_gguf.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
