#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (nvcc on PATH): ggml-python with CUDA, the default sweep on cpu,
# cuda and cuda-strict (TF32 off; config/examples/cuda.yaml, drill-down included), and the
# full-size benchmark shapes on cpu and cuda (--quick), everything under one folder:
#   benchmarks/gpu/run.sh [OUT]        (default results/gpu/<date>)
# OUT/summary.csv, OUT/index.html, OUT/drilldown/, OUT/bench-{cpu,cuda}/, OUT/doctor.json,
# OUT/run.log. Exits non-zero when a step fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-results/gpu/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
exec > >(tee "$out/run.log") 2>&1
start=$(date +%s)
step() { echo "== $(( $(date +%s) - start )) s: $*"; }
cores=$(nproc)

step "setup (ggml-python with CUDA; cached after the first time)"
make setup-cuda CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-native}"
.venv/bin/audioparity doctor --backend cuda > "$out/doctor.json"

step "default sweep on cpu, cuda and cuda-strict"
make run CORES="$cores" SNAKEMAKE_ARGS="--configfile config/examples/cuda.yaml"
cp results/report/summary.csv results/report/index.html "$out/"
[ -d results/drilldown ] && cp -r results/drilldown "$out/"

for backend in cpu cuda; do
    step "full-size benchmark shapes on $backend"
    .venv/bin/python benchmarks/run.py --quick --backend "$backend" --threads "$cores" \
        --wait-quiet 0 --out "$out/bench-$backend"
done
step "done: $out"
