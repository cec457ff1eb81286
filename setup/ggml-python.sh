#!/usr/bin/env bash
# ggml-python built from its source package with the given CMake arguments (and a patch, if
# given), into the venv of PYTHON. The wheel is kept in AUDIOPARITY_WHEELS (default
# ~/.cache/audioparity/wheels), keyed by the version, the CMake arguments, the patch and the CPU's
# flags (a native build runs only where it was built), so a second setup installs it without
# compiling. The cache is shared by every checkout of the machine: one run at a time builds a
# wheel (flock(1) on $cache/.<entry>.lock; another run says it waits, then reuses the wheel), into
# a folder renamed into place once the wheel is in it, so a wheel seen there is complete.
#   usage: setup/ggml-python.sh PYTHON "CMAKE_ARGS" [PATCH]
set -euo pipefail
python=$1
cmake_args=$2
patch_file=${3:-}
version=0.0.45
cache=${AUDIOPARITY_WHEELS:-$HOME/.cache/audioparity/wheels}
key=$( { echo "$version $cmake_args"; grep -m1 '^flags' /proc/cpuinfo || true
         if [ -n "$patch_file" ]; then cat "$patch_file"; fi; } | sha256sum | cut -c1-16)
entry=ggml-python-$version-$key
wheels=$cache/$entry
mkdir -p "$cache"
exec 9>"$cache/.$entry.lock"
if ! flock --nonblock 9; then
    echo "setup: waiting for another build of $entry (lock $cache/.$entry.lock)" >&2
    flock 9
fi
if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    work=$(mktemp -d)
    partial=$cache/.$entry.partial  # this run's while it holds the lock
    rm -rf "$partial"
    mkdir "$partial"
    trap 'rm -rf "$work" "$partial"' EXIT
    echo "setup: building ggml-python $version with $cmake_args${patch_file:+ and $patch_file} (minutes)" >&2
    "$python" -m pip download --quiet --no-deps --no-binary :all: "ggml-python==$version" -d "$work"
    tar xzf "$work/ggml_python-$version.tar.gz" -C "$work"
    if [ -n "$patch_file" ]; then patch --quiet -p1 -d "$work/ggml_python-$version" < "$patch_file"; fi
    CMAKE_ARGS="$cmake_args" "$python" -m pip wheel --quiet --no-deps --no-cache-dir \
        -w "$work/wheel" "$work/ggml_python-$version"
    mv "$work"/wheel/*.whl "$partial"/
    rm -rf "$wheels"
    mv -T "$partial" "$wheels"
    trap 'rm -rf "$work"' EXIT
fi
exec 9>&-
"$python" -m pip install --quiet --force-reinstall --no-deps "$wheels"/*.whl
