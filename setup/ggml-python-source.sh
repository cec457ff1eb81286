#!/usr/bin/env bash
# The source package of ggml-python VERSION (its .tar.gz), its path printed on stdout:
# AUDIOPARITY_GGML_SOURCE when that is set (a local copy: an offline bundle's), else the one kept
# in $AUDIOPARITY_WHEELS/sources/ (default ~/.cache/audioparity/wheels), else downloaded there by
# pip first, once. With PIP_NO_INDEX set (pip's own switch: offline) nothing is downloaded: no
# package given or kept is one line of error. setup/ggml-python.sh and the tests use it.
#   usage: setup/ggml-python-source.sh PYTHON VERSION
set -euo pipefail
python=$1
version=$2
if [ -n "${AUDIOPARITY_GGML_SOURCE:-}" ]; then
    if [ ! -f "$AUDIOPARITY_GGML_SOURCE" ]; then
        echo "setup: AUDIOPARITY_GGML_SOURCE=$AUDIOPARITY_GGML_SOURCE is not a file" >&2
        exit 1
    fi
    echo "$AUDIOPARITY_GGML_SOURCE"
    exit 0
fi
sources=${AUDIOPARITY_WHEELS:-$HOME/.cache/audioparity/wheels}/sources
kept=$sources/ggml_python-$version.tar.gz
if [ ! -f "$kept" ]; then
    if [ -n "${PIP_NO_INDEX:-}" ]; then
        echo "setup: PIP_NO_INDEX is set (offline) and there is no $kept:" \
            "set AUDIOPARITY_GGML_SOURCE to the source package of ggml-python $version" >&2
        exit 1
    fi
    mkdir -p "$sources"
    download=$(mktemp -d "$sources/.download.XXXXXX")
    trap 'rm -rf "$download"' EXIT
    "$python" -m pip download --quiet --no-deps --no-binary :all: "ggml-python==$version" \
        -d "$download" >&2
    mv "$download/ggml_python-$version.tar.gz" "$kept"  # a rename: a kept package is complete
fi
echo "$kept"
