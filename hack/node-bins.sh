#!/usr/bin/env bash
# Builds the node binaries of the single-node cluster the cluster tests run
# (internal/testkit/node): kubelet, kube-proxy, kube-scheduler,
# kube-controller-manager and kubectl, from the pinned k8s.io/kubernetes in
# e2e/tools/node, and the cluster DNS, CoreDNS with the plugins a kubeadm
# Corefile uses, from e2e/tools/coredns, into bin/node/ (or $1). etcd and
# kube-apiserver are the envtest builds (hack/envtest-bins.sh, bin/k8s).
#
# All five are built by one `go build` so they share one compile of what
# they have in common (client-go, the API types, component-base), and with
# the flags envtest-bins.sh uses, so Go's build cache shares the packages
# kube-apiserver compiled too. The build runs only when a binary is missing
# or the stamp differs (pinned version, the tools module's go.mod/go.sum, the
# Go version); a lock keeps two concurrent runs from building twice.
set -euo pipefail

go=${GO:-go}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bin/node}
# The builds run in the tools modules' directories: a relative $1 is made
# absolute first, or they would write into those directories.
mkdir -p "$out" && out=$(cd "$out" && pwd)
tools=$root/e2e/tools/node
dns=$root/e2e/tools/coredns
bins=(kubelet kube-proxy kube-scheduler kube-controller-manager kubectl)
mkdir -p "$out"

kube_version=$(cd "$tools" && "$go" list -m -f '{{.Version}}' k8s.io/kubernetes)
coredns_version=$(cd "$dns" && "$go" list -m -f '{{.Version}}' github.com/coredns/coredns)
stamp_want="node-bins 2
kubernetes $kube_version
coredns $coredns_version
$("$go" env GOVERSION)
$(cat "$tools/go.mod" "$tools/go.sum" "$dns/go.mod" "$dns/go.sum" "$dns/main.go" | sha256sum | cut -d' ' -f1)"

up_to_date() {
	for b in "${bins[@]}" coredns; do
		[ -x "$out/$b" ] || return 1
	done
	[ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp_want" ]
}

exec 9>"$out/.lock"
flock 9
if up_to_date; then
	exit 0
fi

rm -rf "$out"/.build.* # left by an interrupted build; we hold the lock
echo "node-bins: building ${bins[*]} $kube_version into $out (minutes, once)"
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
minor=$(echo "$kube_version" | cut -d. -f2)
vpkg=k8s.io/component-base/version
pkgs=()
for b in "${bins[@]}"; do
	pkgs+=("k8s.io/kubernetes/cmd/$b")
done
start=$SECONDS
(cd "$tools" && CGO_ENABLED=0 "$go" build -trimpath \
	-ldflags="-s -w -X $vpkg.gitVersion=$kube_version -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean" \
	-o "$tmp/" "${pkgs[@]}")
echo "node-bins: built in $((SECONDS - start))s"
start=$SECONDS
(cd "$dns" && CGO_ENABLED=0 "$go" build -trimpath -ldflags="-s -w" -o "$tmp/coredns" .)
echo "node-bins: coredns $coredns_version built in $((SECONDS - start))s"

rm -f "$out/.stamp"
for b in "${bins[@]}" coredns; do
	mv -f "$tmp/$b" "$out/"
done
printf '%s\n' "$stamp_want" >"$out/.stamp"
"$out/kubelet" --version
