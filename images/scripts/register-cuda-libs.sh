#!/bin/bash
# register-cuda-libs.sh: lets the dynamic loader find NCCL and the CUDA runtime from the
# nvidia-* wheels that torch installed, so Horovod's libraries (linked against
# libnccl.so.2 and libcudart.so.12/.13) resolve them whether or not torch was imported first.
set -euo pipefail
purelib="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# CUDA 12's wheels have a folder each (nvidia/nccl, nvidia/cuda_runtime); CUDA 13's share one
# tree (nvidia/cu13/lib), NCCL's keeps its own.
for dir in "$purelib"/nvidia/nccl/lib "$purelib"/nvidia/cuda_runtime/lib "$purelib"/nvidia/cu[0-9]*/lib; do
    if [ -d "$dir" ]; then echo "$dir"; fi
done > /etc/ld.so.conf.d/nvidia-wheels.conf
ldconfig
