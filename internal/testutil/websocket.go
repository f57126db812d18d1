package testutil

import (
	"bufio"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
)

// The Target answers a WebSocket opening handshake on any path by echoing
// every message back (RFC 6455, text and binary frames, no extensions):
// the echo server of the WebSocket tests, with its source address seen as
// for any request.

// webSocketGUID is RFC 6455's key suffix.
const webSocketGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

func isWebSocketRequest(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

func webSocketAccept(key string) string {
	h := sha1.Sum([]byte(key + webSocketGUID))
	return base64.StdEncoding.EncodeToString(h[:])
}

// serveWebSocket upgrades and echoes until the client closes.
func (tg *Target) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Sec-WebSocket-Key")
	if key == "" || !strings.Contains(strings.ToLower(r.Header.Get("Connection")), "upgrade") {
		http.Error(w, "not a WebSocket handshake", http.StatusBadRequest)
		return
	}
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
		webSocketAccept(key) + "\r\n\r\n")
	if brw.Flush() != nil {
		return
	}
	for {
		op, payload, err := readFrame(brw.Reader)
		if err != nil || op == 8 { // close
			return
		}
		if op == 1 || op == 2 {
			if writeFrame(c, op, payload, false) != nil {
				return
			}
		}
	}
}

// WebSocketHandshake opens a WebSocket for target (an http:// URL) on c:
// in absolute form when proxyForm (to a forward proxy), else origin form.
// It returns the reader to go on with and the answer; an answer other than
// 101 is returned without error, for the caller to judge.
func WebSocketHandshake(c net.Conn, target string, proxyForm bool) (*bufio.Reader, *http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, target, nil)
	if err != nil {
		return nil, nil, err
	}
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	key := base64.StdEncoding.EncodeToString(nonce[:])
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Sec-WebSocket-Key", key)
	req.Header.Set("Sec-WebSocket-Version", "13")
	if proxyForm {
		err = req.WriteProxy(c)
	} else {
		err = req.Write(c)
	}
	if err != nil {
		return nil, nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode == http.StatusSwitchingProtocols && resp.Header.Get("Sec-WebSocket-Accept") != webSocketAccept(key) {
		return nil, nil, fmt.Errorf("101 with Sec-WebSocket-Accept %q, want %q", resp.Header.Get("Sec-WebSocket-Accept"), webSocketAccept(key))
	}
	return br, resp, nil
}

// WebSocketEcho sends msg as a text message on an open socket and returns
// the message that comes back.
func WebSocketEcho(c net.Conn, br *bufio.Reader, msg string) (string, error) {
	if err := writeFrame(c, 1, []byte(msg), true); err != nil {
		return "", err
	}
	op, payload, err := readFrame(br)
	if err != nil {
		return "", err
	}
	if op != 1 {
		return "", fmt.Errorf("frame opcode %d, want a text message", op)
	}
	return string(payload), nil
}

// WebSocketClose sends a close frame.
func WebSocketClose(c net.Conn) error { return writeFrame(c, 8, nil, true) }

// writeFrame writes one final frame; a client masks it (RFC 6455 5.3).
func writeFrame(w io.Writer, op byte, payload []byte, mask bool) error {
	head := []byte{0x80 | op, 0}
	n := len(payload)
	switch {
	case n < 126:
		head[1] = byte(n)
	case n < 1<<16:
		head[1] = 126
		head = binary.BigEndian.AppendUint16(head, uint16(n))
	default:
		head[1] = 127
		head = binary.BigEndian.AppendUint64(head, uint64(n))
	}
	body := payload
	if mask {
		head[1] |= 0x80
		var key [4]byte
		_, _ = rand.Read(key[:])
		head = append(head, key[:]...)
		body = make([]byte, n)
		for i := range payload {
			body[i] = payload[i] ^ key[i%4]
		}
	}
	_, err := w.Write(append(head, body...))
	return err
}

// readFrame reads one frame (unmasking it) and returns its opcode and
// payload; fragmented messages are not used by these tests.
func readFrame(br *bufio.Reader) (byte, []byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, nil, err
	}
	if h[0]&0x80 == 0 {
		return 0, nil, errors.New("fragmented WebSocket frame")
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	if n > 1<<20 {
		return 0, nil, errors.New("WebSocket frame above 1 MiB")
	}
	var key [4]byte
	masked := h[1]&0x80 != 0
	if masked {
		if _, err := io.ReadFull(br, key[:]); err != nil {
			return 0, nil, err
		}
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(br, payload); err != nil {
		return 0, nil, err
	}
	if masked {
		for i := range payload {
			payload[i] ^= key[i%4]
		}
	}
	return h[0] & 0x0f, payload, nil
}
