#!/bin/bash
# dedupe-cuda-libs.sh: one copy of each CUDA library in the image. Triton (a dependency of
# torch's CUDA wheel) bundles CUPTI in triton/backends/nvidia/lib/cupti: a second copy of
# libcupti.so.12, libnvperf_host.so, ... next to the nvidia-cuda-cupti(-cu12) wheel that torch
# pins and that torch and TensorFlow load. Each bundled library becomes a link to the wheel's
# library of the same name (up to ".so"), so Triton's profiler finds the variant's CUPTI
# where it looks. Runs in the pip step itself: a file deleted in a later layer would still
# be in the image.
set -euo pipefail
purelib="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
bundled="$purelib/triton/backends/nvidia/lib/cupti"
wheel=""     # CUDA 12: the nvidia-cuda-cupti-cu12 wheel's folder; CUDA 13: the nvidia/cu13 tree
for dir in "$purelib/nvidia/cuda_cupti/lib" "$purelib"/nvidia/cu[0-9]*/lib; do
    if compgen -G "$dir/libcupti.so*" > /dev/null; then wheel="$dir"; break; fi
done
[ -d "$bundled" ] && [ -n "$wheel" ] || exit 0
for lib in "$bundled"/*.so*; do
    [ -f "$lib" ] && [ ! -L "$lib" ] || continue
    stem="$(basename "$lib")"
    stem="${stem%%.so*}"
    target="$(find "$wheel" -maxdepth 1 -type f -name "$stem.so*" | sort | head -n 1)"
    if [ -z "$target" ]; then
        echo "dedupe-cuda-libs: no $stem.so* in $wheel: keeping $lib"
        continue
    fi
    ln -sfn "$(realpath --relative-to="$bundled" "$target")" "$lib"
    echo "dedupe-cuda-libs: $lib -> $target"
done
