#!/bin/bash
# link-identical-libs.sh DIR...: byte-identical copies of a shared library under DIR become
# hard links to one file, which a layer stores once. Debian trixie's libopenmpi40 installs
# libprrte.so.3.0.8 twice (in the multiarch folder and in openmpi/lib). Runs in the apt
# step itself: a file replaced in a later layer would still be in the image.
set -euo pipefail
declare -A first
while IFS= read -r -d '' lib; do
    sum="$(sha256sum "$lib" | cut -d' ' -f1)"
    if [ -n "${first[$sum]:-}" ]; then
        ln -f "${first[$sum]}" "$lib"
        echo "link-identical-libs: $lib -> ${first[$sum]}"
    else
        first[$sum]="$lib"
    fi
done < <(find "$@" -xdev -type f -name 'lib*.so*' -print0 | sort -z)
