#!/usr/bin/env bash
# Builds the root file system of the crawler image the cluster tests run on
# their node (internal/testkit/node): Debian 12's curl, python3 and
# python3-requests in a minimal root made with mmdebstrap, as a tar: the
# clients a crawling team runs, and `python3 -m http.server` for a site.
#
# Usage: hack/crawler-rootfs.sh OUT.tar
# The tar is cached in the user's cache directory under the sha256 of this
# script (the recipe); OUT is a symlink to it, so a run with an unchanged
# recipe costs nothing.
set -euo pipefail

out=${1:?usage: hack/crawler-rootfs.sh OUT.tar}
recipe=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/proxyfleet
cached="$cache/crawler-rootfs-$recipe.tar"
mkdir -p "$(dirname "$out")"
if [ -s "$cached" ]; then
	ln -sfn "$cached" "$out"
	exit 0
fi
if ! command -v mmdebstrap >/dev/null 2>&1; then
	echo "crawler-rootfs: mmdebstrap is missing (hack/install-deps.sh installs it)" >&2
	exit 1
fi
if [ "$(id -u)" != 0 ]; then
	echo "crawler-rootfs: mmdebstrap needs root here (it chroots into the new tree)" >&2
	exit 1
fi
mkdir -p "$cache"
exec 9>"$cache/crawler-rootfs.lock"
flock 9
if [ -s "$cached" ]; then
	ln -sfn "$cached" "$out"
	exit 0
fi

mirror=${CRAWLER_ROOTFS_MIRROR:-http://deb.debian.org/debian}
start=$SECONDS
# essential: dpkg, the base files and what the clients depend on, no apt
# (the host's resolves the packages).
mmdebstrap --variant=essential --include=curl,python3,python3-requests,ca-certificates \
	--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--customize-hook='rm -rf "$1/var/cache/apt/"* "$1/var/lib/apt/lists/"* "$1/var/log/"*.log' \
	bookworm "$cached.tmp.tar" "$mirror"
mv "$cached.tmp.tar" "$cached"
for old in "$cache"/crawler-rootfs-*.tar; do [ "$old" = "$cached" ] || rm -f "$old"; done
ln -sfn "$cached" "$out"
echo "crawler-rootfs: $cached ($(du -h "$cached" | cut -f1)) in $((SECONDS - start)) s"
