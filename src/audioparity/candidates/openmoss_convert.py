"""A MOSS checkpoint as openmoss's GGUF pair, made by openmoss's own converter.

``python openmoss_convert.py MOSS_DIR OUTFILE --outtype f32|bf16 --openmoss DIR --llama-cpp DIR``

Runs openmoss's ``scripts/convert_hf_to_gguf.py --moss-tts MOSS_DIR --output OUTFILE`` (the
Qwen3 backbone in ``OUTFILE``, the codebook embeddings and audio heads in
``OUTFILE.extras.gguf``), unmodified but for two answers given from here:

- the backbone step, which openmoss runs as llama.cpp's ``convert_hf_to_gguf.py`` in a
  subprocess, runs through :mod:`.llama_cpp_convert` instead (the same converter, with its
  pre-tokenizer answer for a small Qwen2-style tokenizer);
- at f32 the extras are kept in f32: openmoss writes them bf16, f16 or q8_0 only
  (``--sidecar-dtype``), so its ``_sidecar_must_stay_f32`` answers yes for every tensor.

Runs as a script in its own process; exits non-zero with the converter's message on bad input.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("moss_dir", type=Path)
    parser.add_argument("outfile", type=Path)
    parser.add_argument("--outtype", required=True, choices=("f32", "bf16"))
    parser.add_argument("--openmoss", required=True, type=Path)
    parser.add_argument("--llama-cpp", required=True, type=Path)
    args = parser.parse_args()

    script = args.openmoss / "scripts" / "convert_hf_to_gguf.py"
    spec = importlib.util.spec_from_file_location("openmoss_convert_hf_to_gguf", script)
    converter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(converter)

    def backbone(qwen3_dir: Path, gguf_path: Path, llama_cpp_dir: Path, dtype: str) -> None:
        subprocess.run([sys.executable, str(Path(__file__).with_name("llama_cpp_convert.py")),
                        str(qwen3_dir), str(gguf_path), "--outtype", dtype, "--llama-cpp",
                        str(llama_cpp_dir)], check=True)

    converter.run_llama_cpp_converter = backbone
    if args.outtype == "f32":
        converter._sidecar_must_stay_f32 = lambda name, array: True
    args.outfile.parent.mkdir(parents=True, exist_ok=True)
    sys.argv = [str(script), "--moss-tts", str(args.moss_dir), "--output", str(args.outfile),
                "--llama-cpp-dir", str(args.llama_cpp), "--backbone-dtype", args.outtype,
                "--sidecar-dtype", "bf16"]
    converter.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
