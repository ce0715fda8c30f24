#!/bin/bash
# apt-install.sh [--non-free] PACKAGE...
# Installs Debian packages without recommends. Used at build time only (bind-mounted).
#   APT_MIRROR   a Debian mirror that replaces deb.debian.org (air-gapped build farms)
#   --non-free   also enables contrib and non-free (the builder's CUDA toolkit lives there)
set -euo pipefail

non_free=0
if [ "${1:-}" = "--non-free" ]; then non_free=1; shift; fi

# shellcheck disable=SC1091
. /etc/os-release
mirror="${APT_MIRROR:-http://deb.debian.org/debian}"
mirror="${mirror%/}"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*; do
    [ -f "$f" ] && sed -i "s#http://deb.debian.org/debian#${mirror}#g" "$f"
done
if [ "$non_free" = 1 ]; then
    echo "deb ${mirror} ${VERSION_CODENAME} contrib non-free non-free-firmware" \
        > /etc/apt/sources.list.d/contrib-non-free.list
fi

# Keep downloaded packages: /var/cache/apt is a BuildKit cache mount, not part of the layer.
rm -f /etc/apt/apt.conf.d/docker-clean
echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' > /etc/apt/apt.conf.d/keep-cache

apt-get update -qq
apt-get install -y -qq --no-install-recommends "$@"
