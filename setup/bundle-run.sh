#!/usr/bin/env bash
# A bundle's host side (docs/bundles.md), copied to the bundle's root as `run`: with no network
# and no package index, it installs the bundle's wheels into .venv beside it, builds ggml-python
# from the bundled source package with the bundle's backend (`make ggml-python`, as
# setup-vulkan and setup-cuda do), checks the device, runs the candidate side of the bundle's
# cells (the same workflow and config, allowed only the rules that run ggml), and leaves what
# it computed in returned/, for `audioparity bundle merge` on the first machine.
#   usage: ./run [CORES]        (PYTHON: the interpreter, default python3)
# Exits non-zero when a step fails; returned/ then holds what finished, bundle.json its list
# of what is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")" && pwd)
cd "$root"
cores=${1:-$(nproc)}
python=${PYTHON:-python3}
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$root/wheels" PIP_DISABLE_PIP_VERSION_CHECK=1
export GGML_NO_BACKTRACE=1 GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
field() {  # a field of bundle.json, a list's items on one line
    "$python" -c 'import json, sys; v = json.load(open(sys.argv[2]))[sys.argv[1]]
print(v if isinstance(v, str) else " ".join(v))' "$1" "$root/bundle.json"
}
step() { echo "== bundle: $*" >&2; }

want=$(field python)
have=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$want" != "$have" ]; then
    echo "bundle: its wheels are for Python $want and $python is $have (PYTHON=python$want ./run)" >&2
    exit 1
fi
backend=$(field ggml_backend)
step "installing the wheels (offline)"
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet -r wheels/build-requirements.txt
step "ggml-python with $backend"
AUDIOPARITY_GGML_SOURCE="$root/$(field ggml_source)" \
    make -C project --no-print-directory ggml-python VENV="$root/.venv" GGML_BACKEND="$backend"
.venv/bin/python -m pip install --quiet "audioparity[workflow]"
.venv/bin/audioparity doctor --backend "$backend" >&2
step "the candidate side of $(field backends)"
# the bundle's source first, as on the first machine, where the jobs' code inputs named it
export PYTHONPATH="$root/project/src"
status=0
(cd project && "$root/.venv/bin/snakemake" --cores "$cores" --rerun-incomplete --keep-going \
    --configfile $(field configfiles) --allowed-rules $(field allowed_rules) \
    -- $(field targets)) || status=$?
.venv/bin/audioparity bundle collect "$root"
exit $status
