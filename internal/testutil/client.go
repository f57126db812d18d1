package testutil

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// ProxyClient is an http.Client that sends everything through proxyURL (which
// may carry user:token credentials for Proxy-Authorization) and never reads
// proxy settings from the environment. tlsConf verifies HTTPS targets (nil:
// system roots). Keep-alives stay on; call CloseIdleConnections when done.
func ProxyClient(proxyURL string, tlsConf *tls.Config) (*http.Client, error) {
	u, err := url.Parse(proxyURL)
	if err != nil {
		return nil, fmt.Errorf("proxy URL: %w", err)
	}
	tr := &http.Transport{
		Proxy:               http.ProxyURL(u),
		TLSClientConfig:     tlsConf,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}, nil
}

// MustProxyClient is ProxyClient for tests; the client's idle connections
// are closed at cleanup.
func MustProxyClient(t testing.TB, proxyURL string, tlsConf *tls.Config) *http.Client {
	t.Helper()
	c, err := ProxyClient(proxyURL, tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// GetAnswer GETs url with c and decodes the Target's answer. A non-2xx
// status is returned with the answer, not as an error, so tests can assert on it.
func GetAnswer(c *http.Client, url string, header http.Header) (*http.Response, TargetAnswer, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, TargetAnswer{}, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, TargetAnswer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp, TargetAnswer{}, err
	}
	var a TargetAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return resp, TargetAnswer{}, fmt.Errorf("%s: body is not a target answer: %q", resp.Status, body)
	}
	return resp, a, nil
}

// ConnectTunnel dials the proxy at proxyAddr, sends CONNECT target with the
// given extra headers, and returns the connection positioned after the
// proxy's answer together with that answer. A non-2xx answer is returned with
// a nil connection and no error, so tests can assert on it.
func ConnectTunnel(proxyAddr, target string, header http.Header, timeout time.Duration) (net.Conn, *http.Response, error) {
	conn, err := net.DialTimeout("tcp", proxyAddr, timeout)
	if err != nil {
		return nil, nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: target},
		Host:   target,
		Header: header.Clone(),
	}
	if req.Header == nil {
		req.Header = http.Header{}
	}
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		conn.Close()
		return nil, resp, nil
	}
	_ = conn.SetDeadline(time.Time{})
	return &bufferedConn{Conn: conn, r: br}, resp, nil
}

// bufferedConn reads first what the CONNECT answer's reader already buffered.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// AskProxy sends one request straight to the proxy at proxyAddr with user
// info u (nil: none, else Basic Proxy-Authorization): a GET of the
// absolute URL target, or, when method is CONNECT, a tunnel to the
// host:port target, closed at once. It returns the proxy's (or the
// target's) answer with its body read and closed: the status and headers
// (Squid names its error page in X-Squid-Error).
func AskProxy(proxyAddr string, u *url.Userinfo, method, target string, timeout time.Duration) (*http.Response, error) {
	var resp *http.Response
	var err error
	if method == http.MethodConnect {
		header := http.Header{}
		if u != nil {
			pw, _ := u.Password()
			header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+pw)))
		}
		var conn net.Conn
		conn, resp, err = ConnectTunnel(proxyAddr, target, header, timeout)
		if conn != nil {
			_ = conn.Close()
		}
	} else {
		proxy := &url.URL{Scheme: "http", Host: proxyAddr, User: u}
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}, Timeout: timeout}
		resp, err = c.Get(target)
	}
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp, nil
}
