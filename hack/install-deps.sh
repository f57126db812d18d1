#!/usr/bin/env bash
# Installs what the test suites need on a fresh Debian machine. Packages come
# from apt when running as root; otherwise a missing package is an error that
# says what to install.
set -euo pipefail

need=()
command -v squid >/dev/null 2>&1 || [ -x /usr/sbin/squid ] || need+=(squid)
# Headless Chromium loads pages through the gateway in the e2e tests.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# Real clients load pages through the MITM gateway in the e2e tests.
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v node >/dev/null 2>&1 || need+=(nodejs)
# wget and git (GnuTLS) and Java's HttpClient (JSSE; keytool makes its trust store)
# are among the TLS stacks mirrored through the MITM gateway in the e2e tests.
command -v wget >/dev/null 2>&1 || need+=(wget)
command -v git >/dev/null 2>&1 || need+=(git)
# Headless Firefox (NSS; certutil fills its profile's trust store) too.
command -v firefox-esr >/dev/null 2>&1 || need+=(firefox-esr)
command -v certutil >/dev/null 2>&1 || need+=(libnss3-tools)
{ command -v java && command -v keytool && command -v javac; } >/dev/null 2>&1 || need+=(default-jdk-headless)
# The kvm provider's tests run a private libvirtd (in namespaces of its own)
# driving real QEMU with OVMF, reached through a private sshd.
kvm_pkgs=()
[ -x /usr/sbin/libvirtd ] || kvm_pkgs+=(libvirt-daemon-system)
[ -x /usr/bin/qemu-system-x86_64 ] || kvm_pkgs+=(qemu-system-x86)
[ -x /usr/bin/qemu-img ] || kvm_pkgs+=(qemu-utils)
[ -x /usr/sbin/sshd ] || kvm_pkgs+=(openssh-server)
[ -e /usr/share/OVMF/OVMF_CODE_4M.fd ] || [ -e /usr/share/OVMF/OVMF_CODE.fd ] || kvm_pkgs+=(ovmf)
command -v ip >/dev/null 2>&1 || kvm_pkgs+=(iproute2)
# make guest-image builds the Debian guest the kvm end-to-end test boots:
# mmdebstrap, then the disk's partition table and file systems without a
# loop device (sfdisk, mkfs.ext4 -d, mkfs.vfat and mtools).
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v sfdisk >/dev/null 2>&1 || [ -x /usr/sbin/sfdisk ] || need+=(fdisk)
command -v mkfs.ext4 >/dev/null 2>&1 || [ -x /usr/sbin/mkfs.ext4 ] || need+=(e2fsprogs)
command -v mkfs.vfat >/dev/null 2>&1 || [ -x /usr/sbin/mkfs.vfat ] || need+=(dosfstools)
command -v mcopy >/dev/null 2>&1 || need+=(mtools)
need+=("${kvm_pkgs[@]}")
# The cluster tests run a single-node Kubernetes (internal/testkit/node):
# Debian's containerd and runc, the CNI plugins in /usr/lib/cni, iptables
# for kube-proxy and portmap, conntrack for kube-proxy's UDP clean-up.
node_pkgs=()
[ -x /usr/bin/containerd ] || node_pkgs+=(containerd)
[ -x /usr/sbin/runc ] || node_pkgs+=(runc)
[ -x /usr/lib/cni/bridge ] || node_pkgs+=(containernetworking-plugins)
command -v iptables-save >/dev/null 2>&1 || [ -x /usr/sbin/iptables-save ] || node_pkgs+=(iptables)
command -v conntrack >/dev/null 2>&1 || [ -x /usr/sbin/conntrack ] || node_pkgs+=(conntrack)
need+=("${node_pkgs[@]}")
# Python clients (requests; aiohttp for WebSockets) go through the gateway in the e2e tests.
if ! { python3 -c 'import aiohttp' || /usr/bin/python3 -c 'import aiohttp'; } >/dev/null 2>&1; then need+=(python3-aiohttp); fi
if ! { python3 -c 'import requests' || /usr/bin/python3 -c 'import requests'; } >/dev/null 2>&1; then need+=(python3-requests); fi
# The Redis lease store's tests start their own redis-server on free ports.
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || need+=(redis-server)
# redis-cli --cluster create builds the Cluster tests' topology (Sentinel
# is redis-server --sentinel, TLS is in Debian's redis-server build).
command -v redis-cli >/dev/null 2>&1 || [ -x /usr/bin/redis-cli ] || need+=(redis-tools)
# promtool (in Debian's prometheus package) checks the chart's alert rules
# and dashboard queries with Prometheus' own parser.
command -v promtool >/dev/null 2>&1 || need+=(prometheus)

if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ]; then
		echo "install-deps: apt-get install ${need[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq "${need[@]}" >/dev/null
		# The package starts a system squid on :3128; the tests run their own.
		if command -v systemctl >/dev/null 2>&1; then systemctl disable --now squid >/dev/null 2>&1 || true; fi
		service squid stop >/dev/null 2>&1 || true
		# Likewise a system redis on :6379; tests never use it.
		if command -v systemctl >/dev/null 2>&1; then systemctl disable --now redis-server >/dev/null 2>&1 || true; fi
		service redis-server stop >/dev/null 2>&1 || true
		# And a system Prometheus on :9090 (the gateway's default metrics
		# address) with its recommended node exporter.
		for svc in prometheus prometheus-node-exporter; do
			if command -v systemctl >/dev/null 2>&1; then systemctl disable --now "$svc" >/dev/null 2>&1 || true; fi
			service "$svc" stop >/dev/null 2>&1 || true
		done
		# The libvirt and OpenSSH packages start system daemons (a libvirtd
		# with a NAT network and dnsmasq, an sshd on :22) that the tests do
		# not use; stop and disable the ones this run installed.
		if [ ${#kvm_pkgs[@]} -gt 0 ]; then
			for unit in libvirtd.service libvirtd.socket libvirtd-ro.socket libvirtd-admin.socket virtlogd.service virtlogd.socket virtlockd.service virtlockd.socket ssh.service ssh.socket; do
				if command -v systemctl >/dev/null 2>&1; then systemctl disable --now "$unit" >/dev/null 2>&1 || true; fi
			done
			for svc in libvirtd virtlogd virtlockd ssh; do service "$svc" stop >/dev/null 2>&1 || true; done
		fi
		# containerd's package starts a system containerd; the node tests
		# run their own, in namespaces of their own.
		if [ ${#node_pkgs[@]} -gt 0 ]; then
			if command -v systemctl >/dev/null 2>&1; then systemctl disable --now containerd >/dev/null 2>&1 || true; fi
			service containerd stop >/dev/null 2>&1 || true
		fi
	else
		echo "install-deps: missing ${need[*]}; run 'sudo apt-get install -y ${need[*]}' or run make test as root" >&2
		exit 1
	fi
fi
