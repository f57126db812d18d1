#!/usr/bin/env bash
# Builds the real kube-apiserver and etcd that envtest runs, from the Go module
# proxy, into bin/k8s/ (or $1). No download site is reachable and Debian's etcd
# is too old for this kube-apiserver, so both are compiled from the pinned
# modules in e2e/tools (kube-apiserver) and e2e/tools/etcd (etcd).
#
# The build runs only when a binary is missing or the stamp differs: the stamp
# holds the pinned versions and a hash of the tools modules' go.mod/go.sum, so a
# version bump rebuilds and everything else reuses bin/k8s/. A lock keeps two
# concurrent `make test` runs from building twice.
set -euo pipefail

# The Go the Makefile uses ($(GO)), so `make GO=/path/to/go test` builds
# these with the same toolchain as everything else.
go=${GO:-go}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bin/k8s}
# The builds run in the tools modules' directories: a relative $1 is made
# absolute first, or they would write into those directories.
mkdir -p "$out" && out=$(cd "$out" && pwd)
tools=$root/e2e/tools
mkdir -p "$out"

kube_version=$(cd "$tools" && "$go" list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd_version=$(cd "$tools/etcd" && "$go" list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
stamp_want="envtest-bins 2
kube-apiserver $kube_version
etcd $etcd_version
$(cd "$tools" && cat go.mod go.sum etcd/go.mod etcd/go.sum | sha256sum | cut -d' ' -f1)"

up_to_date() {
	[ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ] && [ -f "$out/.stamp" ] &&
		[ "$(cat "$out/.stamp")" = "$stamp_want" ]
}

exec 9>"$out/.lock"
flock 9
if up_to_date; then
	exit 0
fi

rm -rf "$out"/.build.* # left by an interrupted build; we hold the lock
echo "envtest-bins: building kube-apiserver $kube_version and etcd $etcd_version into $out (minutes, once)"
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0
start=$SECONDS
(cd "$tools/etcd" && "$go" build -trimpath -ldflags="-s -w" -o "$tmp/etcd" .)
echo "envtest-bins: etcd built in $((SECONDS - start))s"
# Stamp the version the way Kubernetes' release build does, so /version and
# `kubectl version` report v1.37.x instead of v0.0.0-master.
minor=$(echo "$kube_version" | cut -d. -f2)
vpkg=k8s.io/component-base/version
start=$SECONDS
(cd "$tools" && "$go" build -trimpath \
	-ldflags="-s -w -X $vpkg.gitVersion=$kube_version -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean" \
	-o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
echo "envtest-bins: kube-apiserver built in $((SECONDS - start))s"

rm -f "$out/.stamp"
mv -f "$tmp/etcd" "$tmp/kube-apiserver" "$out/"
printf '%s\n' "$stamp_want" >"$out/.stamp"
# sed reads to the end: head would exit after one line and etcd, writing its
# later lines into a closed pipe, would die of SIGPIPE and fail the pipeline
# under pipefail (timing-dependent, so it passed on some machines).
"$out/etcd" --version | sed -n 1p
"$out/kube-apiserver" --version
