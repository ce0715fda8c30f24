#!/usr/bin/env bash
# make-base-image.sh RELEASE TAG [MIRROR]
# Builds a minimal Debian base image locally (debootstrap + docker import), for build
# farms that cannot pull from a registry. Use it with `build.py build --base-image`.
#   scripts/make-base-image.sh bookworm local/debian:bookworm-slim
set -euo pipefail
release="$1"; tag="$2"
mirror="${3:-$(awk '/^URIs:/ {print $2; exit} /^deb / {print $2; exit}' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)}"
mirror="${mirror:-http://deb.debian.org/debian}"
docker="${DOCKER:-docker}"
if "$docker" image inspect "$tag" > /dev/null 2>&1; then
    echo "$tag exists"; exit 0
fi
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
echo "debootstrap $release from $mirror"
debootstrap --variant=minbase "$release" "$root" "$mirror" > "$root.log" 2>&1 || { tail -20 "$root.log"; exit 1; }
tar -C "$root" -c . | "$docker" import --change 'CMD ["bash"]' - "$tag"
echo "$tag imported"
