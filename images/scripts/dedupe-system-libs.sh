#!/bin/bash
# dedupe-system-libs.sh: one copy of each library that both Debian and a wheel install.
# torch's CPU wheel bundles GNU OpenMP (torch/lib/libgomp.so.1) and cpu-mxnet's runtime
# installs Debian's libgomp1 for MXNet. The loader keeps one library per soname in a
# process (whichever loads first), so a process already ran on one of them; each wheel's
# copy becomes a link to Debian's library of the same versioned name. Runs in the pip step
# itself: a file deleted in a later layer would still be in the image.
set -euo pipefail
purelib="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
system="/usr/lib/$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("MULTIARCH"))')"
# Versioned names only (libgomp.so.1): Python extension modules end in a bare .so.
find "$purelib" -type f -name 'lib*.so.*' -print0 | while IFS= read -r -d '' lib; do
    name="$(basename "$lib")"
    [ -e "$system/$name" ] || continue
    ln -sfn "$system/$name" "$lib"
    echo "dedupe-system-libs: $lib -> $system/$name"
done
