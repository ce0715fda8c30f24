#!/bin/bash
# build-horovod.sh VERSION PATCH_DIR WHEEL_DIR
# Downloads the Horovod sdist, applies every PATCH_DIR/*.patch in order, and builds a
# wheel into WHEEL_DIR. The HOROVOD_* build settings come from the environment; pip's
# (PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR) take the sdist from DIR instead of the index.
set -euo pipefail
version="$1"; patches="$2"; out="$3"
here="$(dirname "$0")"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$here/pip.sh" download --no-deps --no-binary :all: --dest "$work" "horovod==${version}"
tar -xzf "$work/horovod-${version}.tar.gz" -C "$work"
src="$work/horovod-${version}"
for patch in "$patches"/*.patch; do
    echo "applying $(basename "$patch")"
    patch --directory "$src" --strip 1 --forward --input "$patch"
done

if [ "${HOROVOD_GPU_OPERATIONS:-}" = "NCCL" ]; then
    # The nvidia-nccl-cu12/-cu13 wheels ship include/nccl.h and lib/libnccl.so.2 but no
    # libnccl.so, which the linker needs: add the link, point Horovod's CMake at it.
    purelib="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    export HOROVOD_NCCL_HOME="$purelib/nvidia/nccl"
    ln -sf libnccl.so.2 "$HOROVOD_NCCL_HOME/lib/libnccl.so"
    # CUDA 13's wheels make a toolkit tree (nvidia/cu13) that lacks two links a toolkit has:
    # lib64 (where nvcc.profile looks for cudart_static and cudadevrt) and libcudart.so.
    home="${HOROVOD_CUDA_HOME:-}"
    if [[ "$home" == */nvidia/cu[0-9]* ]]; then
        if [ ! -e "$home/lib64" ]; then ln -s lib "$home/lib64"; fi
        cudart="$(find "$home/lib" -maxdepth 1 -name 'libcudart.so.*' | head -n 1)"
        if [ -n "$cudart" ] && [ ! -e "$home/lib/libcudart.so" ]; then
            ln -s "$(basename "$cudart")" "$home/lib/libcudart.so"
        fi
    fi
fi

# -k: report every file that fails, not just the first.
export MAKEFLAGS="-j$(nproc) -k"
"$here/pip.sh" wheel --no-deps --no-build-isolation --wheel-dir "$out" "$src"
