#!/bin/bash
# pip.sh SUBCOMMAND ARGS...   (install | wheel | download)
# Runs pip with the build farm's settings. Used at build time only (bind-mounted):
#   /run/secrets/ca_cert  extra CA certificate(s) (BuildKit secret `ca_cert`), added to
#                         Debian's roots in a temporary bundle that is deleted before the
#                         step ends, so it never reaches a layer
#   /wheelhouse/*.whl     local wheels, used as --find-links (air-gapped farms, CPU torch)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL   read by pip itself (build args)
set -euo pipefail

sub="$1"; shift
extra=()
if [ -s /run/secrets/ca_cert ]; then
    bundle="$(mktemp)"
    trap 'rm -f "$bundle"' EXIT
    cat /etc/ssl/certs/ca-certificates.crt /run/secrets/ca_cert > "$bundle"
    export PIP_CERT="$bundle"
fi
if compgen -G "/wheelhouse/*.whl" > /dev/null; then
    extra+=(--find-links /wheelhouse)
fi
export PIP_ROOT_USER_ACTION=ignore PIP_PROGRESS_BAR=off
python3 -m pip "$sub" "${extra[@]}" "$@"
