#!/usr/bin/env bash
# The Debian packages named, installed when missing (as root, or through sudo).
#   usage: setup/apt.sh PACKAGE ...
set -euo pipefail
missing=()
for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$package")
done
if ((${#missing[@]})); then
    sudo=$([ "$(id -u)" = 0 ] || echo sudo)
    echo "setup: apt-get install ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
