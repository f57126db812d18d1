//go:build !sidecar

package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// defaultStatusListen is loopback: the page is for `kubectl port-forward`,
// not for the cluster network.
const defaultStatusListen = "127.0.0.1:8082"

// statusFlags are the status page's flags; controllerCommand appends them.
func statusFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag(flagStatusListen, defaultStatusListen, "`ADDR` serving the fleet's live status page (/status, /status.json) on every replica; 0 turns it off; a non-loopback address needs --insecure-allow-open"),
	}
}

// readStatus reads --status-listen, naming it when wrong.
func (cfg *controllerConfig) readStatus(c *cli.Context) (err error) {
	cfg.StatusListen, err = optionalListen(c, flagStatusListen)
	return err
}

// checkStatusOpen applies the never-open-by-accident rule to the status
// page: it has no authentication and shows the fleet's Proxies with their
// addresses, its members and its cooldowns by site, which the lease API
// gives only to token holders. So a non-loopback --status-listen needs
// --insecure-allow-open said out loud; kubectl port-forward reaches the
// default loopback address.
func checkStatusOpen(listen string, open bool) error {
	if listen == "" || open {
		return nil
	}
	if loopback, err := checkListenAddr(flagStatusListen, listen); err != nil || loopback {
		return err
	}
	return fmt.Errorf("--%s %s is not loopback: the status page has no authentication and lists the fleet; keep it on loopback and reach it with kubectl port-forward, --%s 0 to turn it off, or --%s to serve it to anyone who reaches the address",
		flagStatusListen, listen, flagStatusListen, flagInsecureAllowOpen)
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
