#!/usr/bin/env bash
# Fails when the committed generated files (deepcopy functions under api/ and
# the CRDs in charts/proxyfleet/crds/) differ from what `make generate`
# produces from the api/ types, so a commit with stale generated files fails
# `make test`. Usage: hack/verify-generated.sh <generate command...>
set -euo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/before" charts/proxyfleet/crds
find api -name 'zz_generated*.go' -exec cp --parents {} "$tmp/before/" \;
cp -a charts/proxyfleet/crds "$tmp/before/crds"

"$@" >"$tmp/generate.log" 2>&1 || { cat "$tmp/generate.log" >&2; echo "verify-generated: generate failed" >&2; exit 1; }

mkdir -p "$tmp/after"
find api -name 'zz_generated*.go' -exec cp --parents {} "$tmp/after/" \;
cp -a charts/proxyfleet/crds "$tmp/after/crds"

if ! diff -ruN "$tmp/before" "$tmp/after" >"$tmp/diff"; then
	cat "$tmp/diff" >&2
	echo "verify-generated: generated files were stale; 'make generate' has now updated them (diff above). Review and commit api/ and charts/proxyfleet/crds/." >&2
	exit 1
fi
