#!/bin/bash
# bench/gpu_check.sh [--rehearse | --prepare | --list] [OPTIONS]
# The GPU check of issue 15 (bench/gpu_check.py): on a CUDA host without Docker, build
# Horovod with NCCL, check it, train and time allreduces on the GPU, within 8 minutes.
# PYTHON: the interpreter that has the CUDA build of torch (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" bench/gpu_check.py "$@"
