//go:build sidecar

package main

import "github.com/urfave/cli/v2"

// controllerCommands is empty in the sidecar build (make sidecar, -tags
// sidecar): a gateway beside every crawler pod has no use for the
// controller, and leaving it out leaves out client-go, controller-runtime
// and the Kubernetes API types, whose package initialisation alone costs a
// idle gateway more than half its memory.
func controllerCommands() []*cli.Command { return nil }
