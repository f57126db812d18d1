package socks5

import (
	"errors"
	"io"
	"net"
	"net/url"
	"testing"
	"time"
)

// serve plays a SOCKS5 server's part of one conversation: it reads what the
// client sends and answers with the scripted replies in turn.
func serve(t *testing.T, replies ...[]byte) net.Conn {
	t.Helper()
	client, server := net.Pipe()
	go func() {
		defer server.Close()
		buf := make([]byte, 512)
		for _, r := range replies {
			if _, err := server.Read(buf); err != nil {
				return
			}
			if _, err := server.Write(r); err != nil {
				return
			}
		}
		_, _ = io.Copy(io.Discard, server)
	}()
	_ = client.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { client.Close() })
	return client
}

func TestConnectSpeaksRFC1928(t *testing.T) {
	ok := []byte{5, 0, 0, 1, 10, 0, 0, 1, 0, 80}
	tests := []struct {
		name    string
		user    *url.Userinfo
		replies [][]byte
		code    byte // a ReplyError's code; 0 with wantErr false means success
		wantErr bool
	}{
		{name: "no authentication, CONNECT granted", replies: [][]byte{{5, 0}, ok}},
		{name: "username and password accepted", user: url.UserPassword("u", "p"), replies: [][]byte{{5, 2}, {1, 0}, ok}},
		{name: "username and password refused", user: url.UserPassword("u", "p"), replies: [][]byte{{5, 2}, {1, 1}}, wantErr: true},
		{name: "a server that wants a login we do not have", replies: [][]byte{{5, 2}}, wantErr: true},
		{name: "connection refused is a reply error with its code", replies: [][]byte{{5, 0}, {5, 5, 0, 1, 0, 0, 0, 0, 0, 0}}, code: 5, wantErr: true},
		{name: "not a SOCKS5 server", replies: [][]byte{{4, 0}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Connect(serve(t, tt.replies...), tt.user, "example.com", 443)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Connect: %v, want error %v", err, tt.wantErr)
			}
			var re *ReplyError
			if got := errors.As(err, &re); got != (tt.code != 0) || (got && re.Code != tt.code) {
				t.Fatalf("Connect: %v, want a reply error with code %d: %v", err, tt.code, got)
			}
		})
	}
}
