#!/usr/bin/env bash
# Builds the root file system of an image the cluster tests run on their
# node (internal/testkit/node): Debian 12 packages in a minimal root made
# with mmdebstrap, as a tar. The test turns it into an image and imports it
# into the node's containerd; no registry is involved.
#
#   squid    Debian's squid. The provider's Pod runs /usr/sbin/squid as
#            Debian's "proxy" user (uid 13) with a read-only root and /tmp
#            an emptyDir.
#   crawler  curl, python3 and python3-requests: the clients a crawling
#            team runs, and `python3 -m http.server` for a site.
#
# Usage: hack/rootfs.sh squid|crawler OUT.tar
# The tar is cached in the user's cache directory under the sha256 of its
# recipe (the mmdebstrap arguments below, the kind's packages included); OUT
# is a symlink to it, so a run with an unchanged recipe costs nothing.
# ROOTFS_MIRROR names another Debian mirror.
set -euo pipefail

usage="usage: hack/rootfs.sh squid|crawler OUT.tar"
kind=${1:?$usage}
out=${2:?$usage}
case $kind in
squid) packages=squid,ca-certificates ;;
crawler) packages=curl,python3,python3-requests,ca-certificates ;;
*)
	echo "rootfs: unknown kind '$kind'; $usage" >&2
	exit 2
	;;
esac

# essential: dpkg, the base files and what the packages depend on, no apt
# (the host's resolves the packages).
args=(--variant=essential "--include=$packages"
	--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
	--dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*'
	--dpkgopt='path-exclude=/usr/share/info/*'
	--customize-hook='rm -rf "$1/var/cache/apt/"* "$1/var/lib/apt/lists/"* "$1/var/log/"*.log'
	bookworm)
recipe=$(printf '%s\n' "${args[@]}" | sha256sum | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/proxyfleet
cached="$cache/$kind-rootfs-$recipe.tar"
mkdir -p "$(dirname "$out")"
if [ -s "$cached" ]; then
	ln -sfn "$cached" "$out"
	exit 0
fi
if ! command -v mmdebstrap >/dev/null 2>&1; then
	echo "rootfs: mmdebstrap is missing (hack/install-deps.sh installs it)" >&2
	exit 1
fi
if [ "$(id -u)" != 0 ]; then
	echo "rootfs: mmdebstrap needs root here (it chroots into the new tree)" >&2
	exit 1
fi
mkdir -p "$cache"
exec 9>"$cache/$kind-rootfs.lock"
flock 9
if [ -s "$cached" ]; then
	ln -sfn "$cached" "$out"
	exit 0
fi

start=$SECONDS
mmdebstrap "${args[@]}" "$cached.tmp.tar" "${ROOTFS_MIRROR:-http://deb.debian.org/debian}"
mv "$cached.tmp.tar" "$cached"
for old in "$cache/$kind"-rootfs-*.tar; do [ "$old" = "$cached" ] || rm -f "$old"; done
ln -sfn "$cached" "$out"
echo "rootfs: $cached ($(du -h "$cached" | cut -f1)) in $((SECONDS - start)) s"
