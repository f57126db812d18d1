// Command etcd is the real etcd server, built from the Go module proxy for
// envtest (kube-apiserver needs an etcd; Debian's 3.4 is too old for it).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
