#!/bin/bash
# register-nccl.sh: lets the dynamic loader find NCCL from the nvidia-nccl-cu12 wheel, so
# Horovod's libraries resolve libnccl.so.2 whether or not torch was imported first.
set -euo pipefail
purelib="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$purelib/nvidia/nccl/lib" > /etc/ld.so.conf.d/nvidia-nccl.conf
ldconfig
