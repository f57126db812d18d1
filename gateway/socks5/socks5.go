// Package socks5 is the gateway's SOCKS5 client (RFC 1928, with RFC 1929
// username and password): CONNECT only, written on the caller's connection
// so a *net.TCPConn stays one and the tunnel can splice(2). It owns the
// wire format and nothing of the gateway's policy: what a refusal means
// for a member is the caller's to say. It imports nothing of proxyfleet's.
package socks5

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"net/url"
	"strconv"
)

// Connect runs a SOCKS5 CONNECT to host:port over c, with username and
// password authentication when user is set. The caller sets c's deadline.
// A server's refusal of the CONNECT is a *ReplyError; anything else failed
// on the way (the greeting, the authentication, a malformed reply).
func Connect(c net.Conn, user *url.Userinfo, host string, port uint16) error {
	var buf [4 + 255 + 2]byte
	b := buf[:0]
	if user != nil {
		b = append(b, 5, 2, 0, 2) // version, 2 methods: none, user/pass
	} else {
		b = append(b, 5, 1, 0)
	}
	if _, err := c.Write(b); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, buf[:2]); err != nil {
		return errors.New("SOCKS5 greeting: " + err.Error())
	}
	if buf[0] != 5 {
		return errors.New("SOCKS5 greeting: not a SOCKS5 server")
	}
	if err := authenticate(c, user, buf[1]); err != nil {
		return err
	}

	b = append(buf[:0], 5, 1, 0) // version, CONNECT, reserved
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		if a.Is4() {
			b = append(b, 1)
		} else {
			b = append(b, 4)
		}
		b = append(b, a.AsSlice()...)
	} else {
		if len(host) > 255 {
			return errors.New("SOCKS5: host name longer than 255 bytes")
		}
		b = append(b, 3, byte(len(host)))
		b = append(b, host...)
	}
	b = append(b, byte(port>>8), byte(port))
	if _, err := c.Write(b); err != nil {
		return err
	}
	return readReply(c, buf[:])
}

// readReply reads the server's reply to CONNECT and the bound address
// behind it; buf is scratch space of at least 255+2 bytes.
func readReply(c net.Conn, buf []byte) error {
	if _, err := io.ReadFull(c, buf[:4]); err != nil {
		return errors.New("SOCKS5 CONNECT: " + err.Error())
	}
	if buf[0] != 5 {
		return errors.New("SOCKS5 CONNECT: malformed reply")
	}
	if rep := buf[1]; rep != 0 {
		return &ReplyError{Code: rep}
	}
	var skip int
	switch buf[3] {
	case 1:
		skip = 4 + 2
	case 4:
		skip = 16 + 2
	case 3:
		if _, err := io.ReadFull(c, buf[:1]); err != nil {
			return errors.New("SOCKS5 CONNECT: " + err.Error())
		}
		skip = int(buf[0]) + 2
	default:
		return errors.New("SOCKS5 CONNECT: bad address type in reply")
	}
	if _, err := io.ReadFull(c, buf[:skip]); err != nil {
		return errors.New("SOCKS5 CONNECT: " + err.Error())
	}
	return nil
}

// authenticate answers the server's choice of method: none, or username
// and password (RFC 1929) when user is set.
func authenticate(c net.Conn, user *url.Userinfo, method byte) error {
	var buf [2]byte
	switch method {
	case 0:
	case 2:
		if user == nil {
			return errors.New("SOCKS5 server wants a username and password")
		}
		name := user.Username()
		pass, _ := user.Password()
		if len(name) == 0 || len(name) > 255 || len(pass) > 255 {
			return errors.New("SOCKS5 username or password length out of range")
		}
		auth := make([]byte, 0, 3+len(name)+len(pass))
		auth = append(auth, 1, byte(len(name)))
		auth = append(auth, name...)
		auth = append(auth, byte(len(pass)))
		auth = append(auth, pass...)
		if _, err := c.Write(auth); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, buf[:2]); err != nil {
			return errors.New("SOCKS5 authentication: " + err.Error())
		}
		if buf[1] != 0 {
			return errors.New("SOCKS5 authentication refused")
		}
	default:
		return errors.New("SOCKS5 server accepts none of our authentication methods")
	}
	return nil
}

// ReplyError is the server's refusal of a CONNECT. Its code says whose
// failure it was (network or host unreachable, refused: the site's; a
// general failure: the server's own), which the caller decides.
type ReplyError struct {
	Code byte
}

func (e *ReplyError) Error() string {
	return "answered SOCKS5 reply " + strconv.Itoa(int(e.Code)) + " (" + replyText(e.Code) + ")"
}

// replyText is RFC 1928's name of a reply code.
func replyText(rep byte) string {
	switch rep {
	case 1:
		return "general failure"
	case 2:
		return "not allowed by ruleset"
	case 3:
		return "network unreachable"
	case 4:
		return "host unreachable"
	case 5:
		return "connection refused"
	case 6:
		return "TTL expired"
	case 7:
		return "command not supported"
	case 8:
		return "address type not supported"
	}
	return "unknown"
}
