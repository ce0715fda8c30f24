#!/bin/bash
# disttrain-pip (disttrain-pip.sh) SUBCOMMAND ARGS...   pip for images built FROM this one (docs/images.md,
# "Add your own dependencies"): pip.sh's build-farm settings (the BuildKit secret ca_cert,
# /wheelhouse), and every `install` held to the versions this image was built with
# (/etc/disttrain/constraints.txt), so a dependency never moves torch, TensorFlow, Horovod
# or NumPy. DISTTRAIN_PIP_UNPINNED=1 lifts the hold.
set -euo pipefail

sub="${1:?usage: disttrain-pip install|download|wheel ARGS...}"; shift
pins=()
if [ "$sub" = install ]; then
    if [ ! -w "${VIRTUAL_ENV:-/opt/venv}" ]; then
        echo "disttrain-pip: ${VIRTUAL_ENV:-/opt/venv} belongs to root, not uid $(id -u): put USER root before this RUN and USER 1000:1000 after it" >&2
        exit 2
    fi
    if [ -z "${DISTTRAIN_PIP_UNPINNED:-}" ]; then
        pins=(--constraint /etc/disttrain/constraints.txt)
    fi
fi
exec /usr/local/lib/disttrain/pip.sh "$sub" "${pins[@]}" "$@"
