#!/usr/bin/env bash
# ggml-python built from its source package with the given CMake arguments (and a patch, if
# given), into the venv of PYTHON. The wheel is kept in AUDIOPARITY_WHEELS (default
# ~/.cache/audioparity/wheels), keyed by the version, the CMake arguments, the patch and the CPU's
# flags (a native build runs only where it was built), so a second setup installs it without
# compiling.
#   usage: setup/ggml-python.sh PYTHON "CMAKE_ARGS" [PATCH]
set -euo pipefail
python=$1
cmake_args=$2
patch_file=${3:-}
version=0.0.45
cache=${AUDIOPARITY_WHEELS:-$HOME/.cache/audioparity/wheels}
key=$( { echo "$version $cmake_args"; grep -m1 '^flags' /proc/cpuinfo || true
         if [ -n "$patch_file" ]; then cat "$patch_file"; fi; } | sha256sum | cut -c1-16)
wheels=$cache/ggml-python-$version-$key
if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    echo "setup: building ggml-python $version with $cmake_args${patch_file:+ and $patch_file} (minutes)" >&2
    "$python" -m pip download --quiet --no-deps --no-binary :all: "ggml-python==$version" -d "$work"
    tar xzf "$work/ggml_python-$version.tar.gz" -C "$work"
    if [ -n "$patch_file" ]; then patch --quiet -p1 -d "$work/ggml_python-$version" < "$patch_file"; fi
    CMAKE_ARGS="$cmake_args" "$python" -m pip wheel --quiet --no-deps --no-cache-dir \
        -w "$work/wheel" "$work/ggml_python-$version"
    mkdir -p "$wheels"
    mv "$work"/wheel/*.whl "$wheels"/
fi
"$python" -m pip install --quiet --force-reinstall --no-deps "$wheels"/*.whl
