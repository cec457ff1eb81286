#!/usr/bin/env bash
# ggml-python built from its source package with the given CMake arguments (and the patches
# given, in order), into the venv of PYTHON. The wheel is kept in AUDIOPARITY_WHEELS (default
# ~/.cache/audioparity/wheels), keyed by the version, the CMake arguments, the patches and the CPU's
# flags (a native build runs only where it was built), so a second setup installs it without
# compiling. The cache is shared by every checkout of the machine: one run at a time builds a
# wheel (flock(1) on $cache/.<entry>.lock; another run says it waits, then reuses the wheel), into
# a folder renamed into place once the wheel is in it, so a wheel seen there is complete.
# The source package comes from setup/ggml-python-source.sh (kept in the cache, or
# AUDIOPARITY_GGML_SOURCE); with PIP_NO_INDEX set (offline) pip builds without build isolation,
# so ggml-python's build requirements (scikit-build-core) must be in the venv already. Before
# compiling (minutes), setup/bindings.py checks that the patched source defines every function
# ggml-python binds for the backends the CMake arguments enable (a missing one fails
# `import ggml`); after installing, that the installed libraries export them.
#   usage: setup/ggml-python.sh PYTHON "CMAKE_ARGS" [PATCH...]
set -euo pipefail
python=$1
cmake_args=$2
patches=("${@:3}")
version=0.0.45
here=$(dirname "$0")
cache=${AUDIOPARITY_WHEELS:-$HOME/.cache/audioparity/wheels}
key=$( { echo "$version $cmake_args"; grep -m1 '^flags' /proc/cpuinfo || true
         if ((${#patches[@]})); then cat "${patches[@]}"; fi; } | sha256sum | cut -c1-16)
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
    echo "setup: building ggml-python $version with $cmake_args${patches:+ and ${patches[*]}} (minutes)" >&2
    source_package=$("$here/ggml-python-source.sh" "$python" "$version")
    source=$work/ggml_python-$version
    if ! tar xzf "$source_package" -C "$work" 2>/dev/null || [ ! -d "$source" ]; then
        echo "setup: $source_package is not the source package of ggml-python $version" >&2
        exit 1
    fi
    for patch_file in "${patches[@]}"; do patch --quiet -p1 -d "$source" < "$patch_file"; done
    "$python" "$here/bindings.py" source "$source" --cmake-args="$cmake_args"
    isolation=()
    if [ -n "${PIP_NO_INDEX:-}" ]; then
        if ! "$python" -c "import scikit_build_core" 2>/dev/null; then
            echo "setup: PIP_NO_INDEX is set (offline) and $python has no scikit-build-core," \
                "which builds ggml-python without build isolation: install it first" >&2
            exit 1
        fi
        isolation=(--no-build-isolation)
    fi
    CMAKE_ARGS="$cmake_args" "$python" -m pip wheel --quiet --no-deps --no-cache-dir \
        "${isolation[@]}" -w "$work/wheel" "$source"
    mv "$work"/wheel/*.whl "$partial"/
    rm -rf "$wheels"
    mv -T "$partial" "$wheels"
    trap 'rm -rf "$work"' EXIT
fi
exec 9>&-
"$python" -m pip install --quiet --force-reinstall --no-deps "$wheels"/*.whl
"$python" "$here/bindings.py" built
