#!/bin/bash
# install-requirements.sh DIR [FILE...]
# Installs DIR/runtime.txt (plus any extra requirement FILEs) with dependencies, then
# DIR/runtime-nodeps.txt without them. The second list holds packages whose declared
# dependencies are wrong for this image: tf-keras requires the `tensorflow` distribution,
# which would add a second, 570 MB copy of TensorFlow next to `tensorflow-cpu`.
set -euo pipefail
dir="$1"; shift
here="$(dirname "$0")"
args=(-r "$dir/runtime.txt")
for extra in "$@"; do args+=(-r "$extra"); done
"$here/pip.sh" install "${args[@]}"
if grep -qv '^#' "$dir/runtime-nodeps.txt"; then
    "$here/pip.sh" install --no-deps -r "$dir/runtime-nodeps.txt"
fi
