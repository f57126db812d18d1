#!/usr/bin/env bash
# What make bench needs beyond make test's: the two MITM proxies the
# gateway's MITM is measured against. mitmproxy (mitmdump) comes from apt.
# Squid with ssl-bump is Debian's squid-openssl, which conflicts with the
# squid package the tests use, so it is not installed: its package is
# unpacked into bin/bench/squid-openssl and run from there (it uses the
# installed squid-common's files).
set -euo pipefail

dest=${1:-bin/bench/squid-openssl}
need=()
command -v mitmdump >/dev/null 2>&1 || need+=(mitmproxy)
# The cost model counts a proxy's system calls with strace -c.
command -v strace >/dev/null 2>&1 || need+=(strace)
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "bench-deps: install ${need[*]} (apt-get install -y ${need[*]})" >&2
		exit 1
	fi
	echo "bench-deps: apt-get install ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ ! -x "$dest/usr/sbin/squid" ]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	echo "bench-deps: unpacking squid-openssl into $dest"
	(cd "$tmp" && apt-get download -qq squid-openssl >/dev/null 2>&1) || {
		apt-get update -qq && (cd "$tmp" && apt-get download -qq squid-openssl >/dev/null)
	}
	mkdir -p "$dest"
	dpkg -x "$tmp"/squid-openssl_*.deb "$dest"
fi
# The bumping Squid drops to the proxy user when started as root: its
# certificate helper must be reachable by it.
chmod -R a+rX "$dest"
"$dest/usr/sbin/squid" -v | sed -n 1p
