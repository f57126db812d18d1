//go:build !sidecar

package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// flagStatusListen is where the controller serves its status page.
const flagStatusListen = "status-listen"

// defaultStatusListen is loopback: the page is for `kubectl port-forward`,
// not for the cluster network.
const defaultStatusListen = "127.0.0.1:8082"

// statusFlags are the status page's flags; controllerCommand appends them.
func statusFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag(flagStatusListen, defaultStatusListen, "`ADDR` serving the fleet's live status page (/status, /status.json) on every replica; 0 turns it off"),
	}
}

// readStatus reads --status-listen, naming it when wrong.
func (cfg *controllerConfig) readStatus(c *cli.Context) (err error) {
	cfg.StatusListen, err = optionalListen(c, flagStatusListen)
	return err
}

// optionalListen reads a listen address flag that 0 (or off, or nothing)
// turns off: "" then, else the address, checked.
func optionalListen(c *cli.Context, name string) (string, error) {
	switch addr := strings.TrimSpace(c.String(name)); addr {
	case "", "0", "off":
		return "", nil
	default:
		if _, err := checkListenAddr(name, addr); err != nil {
			return "", err
		}
		return addr, nil
	}
}
