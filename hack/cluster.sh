#!/bin/sh
# hack/cluster.sh up DIR TESTBIN NODEBINS | down DIR
#
# make cluster / make cluster-down (docs/cluster.md, "A cluster on one
# machine"). up starts TESTBIN (the e2e tests built with -tags cluster) as
# TestDemoCluster with $PROXYFLEET_CLUSTER_DIR=DIR, in a session of its own,
# so the cluster outlives this script; it waits until the demo runs (DIR/ready)
# and prints DIR/README.txt. down sends that process SIGTERM: the node stops,
# its namespaces (network, mount, PID) go with it, and the process puts back
# the kernel settings the kubelet changed and removes the kubelet's cgroups
# before it exits.
set -eu

usage() { echo "usage: $0 up DIR TESTBIN NODEBINS | down DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)

alive() { [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; }

case $cmd in
up)
	[ $# -eq 4 ] || usage
	testbin=$3
	nodebins=$(cd "$4" && pwd)
	# The tests find the module's files (the chart, bin/) from their
	# working directory.
	cd "$(dirname "$0")/.."
	if [ "$(id -u)" != 0 ]; then
		echo "make cluster: run as root (the node needs network, mount and PID namespaces and cgroups)" >&2
		exit 1
	fi
	if alive; then
		echo "make cluster: a cluster runs already (pid $(cat "$dir/pid")); make cluster-down ends it" >&2
		exit 1
	fi
	rm -f "$dir/pid" "$dir/netns.pid" "$dir/kubeconfig" "$dir/README.txt" "$dir/ready"
	cat >"$dir/kubectl" <<KUBECTL
#!/bin/sh
# kubectl for the cluster of make cluster.
exec "$nodebins/kubectl" --kubeconfig "$dir/kubeconfig" "\$@"
KUBECTL
	cat >"$dir/exec" <<EXEC
#!/bin/sh
# Runs a command in the network namespace of the cluster of make cluster,
# where pod and Service addresses route: bin/cluster/exec curl http://POD_IP:PORT/
[ -f "$dir/netns.pid" ] || { echo "no cluster runs (make cluster)" >&2; exit 1; }
exec nsenter --net=/proc/\$(cat "$dir/netns.pid")/ns/net -- "\$@"
EXEC
	chmod +x "$dir/kubectl" "$dir/exec"
	echo "make cluster: starting the node and the demo (a few minutes; log: $dir/cluster.log)"
	PROXYFLEET_CLUSTER_DIR=$dir setsid "$testbin" -test.run '^TestDemoCluster$' -test.v -test.timeout 0 \
		>"$dir/cluster.log" 2>&1 </dev/null &
	started=$!
	waited=0
	while [ ! -f "$dir/ready" ]; do
		if ! kill -0 "$started" 2>/dev/null; then
			echo "make cluster: the cluster did not come up; $dir/cluster.log ends:" >&2
			tail -n 80 "$dir/cluster.log" >&2
			exit 1
		fi
		if [ "$waited" -ge 1800 ]; then
			echo "make cluster: not up after 30 minutes; make cluster-down ends it; $dir/cluster.log ends:" >&2
			tail -n 40 "$dir/cluster.log" >&2
			exit 1
		fi
		sleep 2
		waited=$((waited + 2))
	done
	cat "$dir/README.txt"
	;;
down)
	if ! alive; then
		echo "make cluster-down: no cluster runs"
		rm -f "$dir/pid" "$dir/netns.pid" "$dir/kubeconfig" "$dir/README.txt" "$dir/ready"
		exit 0
	fi
	pid=$(cat "$dir/pid")
	kill -TERM "$pid"
	waited=0
	while kill -0 "$pid" 2>/dev/null; do
		if [ "$waited" -ge 300 ]; then
			echo "make cluster-down: process $pid still runs after 5 minutes; $dir/cluster.log ends:" >&2
			tail -n 40 "$dir/cluster.log" >&2
			exit 1
		fi
		sleep 1
		waited=$((waited + 1))
	done
	rm -f "$dir/pid" "$dir/netns.pid" "$dir/kubeconfig" "$dir/README.txt" "$dir/ready"
	if grep -q -- '^--- FAIL' "$dir/cluster.log"; then
		echo "make cluster-down: the cluster's process reports a failure; $dir/cluster.log ends:" >&2
		tail -n 40 "$dir/cluster.log" >&2
		exit 1
	fi
	echo "make cluster-down: the cluster is down"
	;;
*)
	usage
	;;
esac
