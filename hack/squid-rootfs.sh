#!/usr/bin/env bash
# Builds the root file system of the Squid image the cluster tests run on
# their node (internal/testkit/node): Debian 12's squid in a minimal root
# made with mmdebstrap, as a tar. The test turns it into an image and
# imports it into the node's containerd; no registry is involved.
#
# Usage: hack/squid-rootfs.sh OUT.tar
# The tar is cached in the user's cache directory under the sha256 of this
# script (the recipe); OUT is a symlink to it, so a run with an unchanged
# recipe costs nothing.
set -euo pipefail

out=${1:?usage: hack/squid-rootfs.sh OUT.tar}
recipe=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/proxyfleet
cached="$cache/squid-rootfs-$recipe.tar"
mkdir -p "$(dirname "$out")"
if [ -s "$cached" ]; then
	ln -sfn "$cached" "$out"
	exit 0
fi
if ! command -v mmdebstrap >/dev/null 2>&1; then
	echo "squid-rootfs: mmdebstrap is missing (hack/install-deps.sh installs it)" >&2
	exit 1
fi
if [ "$(id -u)" != 0 ]; then
	echo "squid-rootfs: mmdebstrap needs root here (it chroots into the new tree)" >&2
	exit 1
fi
mkdir -p "$cache"
exec 9>"$cache/squid-rootfs.lock"
flock 9
if [ -s "$cached" ]; then
	ln -sfn "$cached" "$out"
	exit 0
fi

mirror=${SQUID_ROOTFS_MIRROR:-http://deb.debian.org/debian}
start=$SECONDS
# essential: dpkg, the base files and what squid depends on, no apt (the
# host's resolves the packages). The provider's Pod runs /usr/sbin/squid as
# Debian's "proxy" user (uid 13) with a read-only root and /tmp an emptyDir.
mmdebstrap --variant=essential --include=squid,ca-certificates \
	--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--customize-hook='rm -rf "$1/var/cache/apt/"* "$1/var/lib/apt/lists/"* "$1/var/log/"*.log' \
	bookworm "$cached.tmp.tar" "$mirror"
mv "$cached.tmp.tar" "$cached"
for old in "$cache"/squid-rootfs-*.tar; do [ "$old" = "$cached" ] || rm -f "$old"; done
ln -sfn "$cached" "$out"
echo "squid-rootfs: $cached ($(du -h "$cached" | cut -f1)) in $((SECONDS - start)) s"
