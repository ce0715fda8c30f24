#!/bin/bash
# dedupe-bundled-libs.sh: a library that a wheel bundles, where Debian or an nvidia-* wheel
# already installs the same one, becomes a link to that copy. Found by the smoke tests'
# duplicate-library check:
#   torch/lib/libgomp.so.1 (GNU OpenMP)     next to Debian's libgomp1 (MXNet's, Open MPI's)
#   torchvision.libs/libcudart.<hash>.so.12 next to the nvidia-cuda-runtime-cu12 wheel
#   torchvision.libs/libz.<hash>.so.1        next to Debian's zlib
# A wheel's own copy keeps its name, so its loader path still finds it; auditwheel's
# copies (`<package>.libs/`, a hash before `.so`) are matched by the name without the hash.
# The loader keeps one library per soname in a process, so a process that loaded both
# already ran on one of them. Runs in the pip step itself: a file replaced in a later
# layer would still be in the image.
set -euo pipefail
purelib="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
system="/usr/lib/$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("MULTIARCH"))')"

kept() {   # the copy of library $1 that stays: Debian's, else an nvidia-* wheel's
    local dir
    for dir in "$system" "$purelib"/nvidia/*/lib; do
        if [ -e "$dir/$1" ]; then echo "$dir/$1"; return; fi
    done
}

# Versioned names only (libgomp.so.1): Python extension modules end in a bare .so.
find "$purelib" -type f -name 'lib*.so.*' -print0 | while IFS= read -r -d '' lib; do
    name="$(basename "$lib")"
    case "$(dirname "$lib")" in
        *.libs) name="$(sed -E 's/[.-][0-9a-f]{8}(\.so(\.[0-9]+)*)$/\1/' <<< "$name")" ;;
        "$purelib"/nvidia/*) continue ;;
    esac
    target="$(kept "$name")"
    if [ -z "$target" ] || [ "$target" -ef "$lib" ]; then continue; fi
    ln -sfn "$target" "$lib"
    echo "dedupe-bundled-libs: $lib -> $target"
done
