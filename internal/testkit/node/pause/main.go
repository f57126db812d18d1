// Command pause is the sandbox ("pause") container of the test node's pods:
// it holds the pod's namespaces and does nothing until it is signalled.
// Built static into the image the node package imports, so no registry is
// needed. It blocks on a signal channel rather than select{}, which the Go
// runtime would report as a deadlock.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}
