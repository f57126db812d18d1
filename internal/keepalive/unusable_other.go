//go:build !linux

package keepalive

// Unusable cannot peek here; a closed connection shows when it is used.
func (c *Conn) Unusable() bool { return false }
