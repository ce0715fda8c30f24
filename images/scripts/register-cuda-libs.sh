#!/bin/bash
# register-cuda-libs.sh: lets the dynamic loader find NCCL and the CUDA runtime from the
# nvidia-* wheels that torch installed, so Horovod's libraries (linked against
# libnccl.so.2 and libcudart.so.12) resolve them whether or not torch was imported first.
set -euo pipefail
purelib="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
for lib in nccl cuda_runtime; do
    [ -d "$purelib/nvidia/$lib/lib" ] && echo "$purelib/nvidia/$lib/lib"
done > /etc/ld.so.conf.d/nvidia-wheels.conf
ldconfig
