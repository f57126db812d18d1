package kvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/proxyfleet/proxyfleet/providers"
)

// tracer makes the libvirt RPC spans; OpenTelemetry's global provider, a
// no-op unless tracing is set up.
var tracer = otel.Tracer("github.com/proxyfleet/proxyfleet/providers/kvm")

// Budgets bound every step that talks to a host. go-libvirt never times out
// on its own, so a call that outlives its budget (or its context) kills the
// connection it runs on — the only way to unblock it — and fails Transient;
// the next call redials.
type Budgets struct {
	// Dial covers TCP, the SSH handshake and libvirt's connect.
	Dial time.Duration
	// RPC is the budget of an ordinary libvirt call.
	RPC time.Duration
	// DomainCreate is the budget of starting a domain.
	DomainCreate time.Duration
	// SeedUpload is the budget of uploading a seed ISO.
	SeedUpload time.Duration
	// ImageTransfer is the budget of downloading and uploading a base image.
	ImageTransfer time.Duration
}

// DefaultBudgets are the production budgets.
func DefaultBudgets() Budgets {
	return Budgets{Dial: 10 * time.Second, RPC: 30 * time.Second, DomainCreate: 90 * time.Second,
		SeedUpload: 60 * time.Second, ImageTransfer: 20 * time.Minute}
}

// DefaultSocket is the system libvirtd's socket on a host.
const DefaultSocket = "/var/run/libvirt/libvirt-sock"

// keepaliveInterval is how often an idle pooled connection is checked; a
// dead peer is found within one or two intervals and the link dropped.
const keepaliveInterval = 15 * time.Second

// api is the narrow seam over go-libvirt: exactly the RPCs the provider
// makes. *libvirt.Libvirt implements it.
type api interface {
	ConnectGetLibVersion() (uint64, error)
	ConnectGetHostname() (string, error)
	ConnectListAllDomains(NeedResults int32, Flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, uint32, error)
	DomainLookupByName(Name string) (libvirt.Domain, error)
	DomainGetState(Dom libvirt.Domain, Flags uint32) (int32, int32, error)
	DomainGetMetadata(Dom libvirt.Domain, Type int32, URI libvirt.OptString, Flags libvirt.DomainModificationImpact) (string, error)
	DomainDefineXMLFlags(XML string, Flags libvirt.DomainDefineFlags) (libvirt.Domain, error)
	DomainCreate(Dom libvirt.Domain) error
	DomainDestroyFlags(Dom libvirt.Domain, Flags libvirt.DomainDestroyFlagsValues) error
	DomainUndefineFlags(Dom libvirt.Domain, Flags libvirt.DomainUndefineFlagsValues) error
	DomainInterfaceAddresses(Dom libvirt.Domain, Source uint32, Flags uint32) ([]libvirt.DomainInterface, error)
	StoragePoolLookupByName(Name string) (libvirt.StoragePool, error)
	StoragePoolRefresh(Pool libvirt.StoragePool, Flags uint32) error
	StoragePoolGetInfo(Pool libvirt.StoragePool) (uint8, uint64, uint64, uint64, error)
	StoragePoolListAllVolumes(Pool libvirt.StoragePool, NeedResults int32, Flags uint32) ([]libvirt.StorageVol, uint32, error)
	StorageVolLookupByName(Pool libvirt.StoragePool, Name string) (libvirt.StorageVol, error)
	StorageVolCreateXML(Pool libvirt.StoragePool, XML string, Flags libvirt.StorageVolCreateFlags) (libvirt.StorageVol, error)
	StorageVolDelete(Vol libvirt.StorageVol, Flags libvirt.StorageVolDeleteFlags) error
	StorageVolGetPath(Vol libvirt.StorageVol) (string, error)
	StorageVolUpload(Vol libvirt.StorageVol, outStream io.Reader, Offset uint64, Length uint64, Flags libvirt.StorageVolUploadFlags) error
}

var _ api = (*libvirt.Libvirt)(nil)

// sshLogin is how to reach every host of an entry. The files are read on
// every dial, never cached, so a rotated Secret takes effect on the next
// connection.
type sshLogin struct {
	User, KeyFile, KnownHostsFile, Socket string
}

func (s sshLogin) clientConfig(timeout time.Duration) (*ssh.ClientConfig, error) {
	key, err := os.ReadFile(s.KeyFile)
	if err != nil {
		return nil, classifySSH(stageMaterial, fmt.Errorf("reading the SSH key file %s: %w", s.KeyFile, err))
	}
	signer, err := ssh.ParsePrivateKey(key)
	if err != nil {
		// The parser's message never includes the key.
		return nil, fmt.Errorf("%w: the SSH key file %s does not hold a usable private key (a .pub, or passphrase-protected?)", providers.ErrPermanent, s.KeyFile)
	}
	hk, err := knownhosts.New(s.KnownHostsFile)
	if err != nil {
		return nil, classifySSH(stageMaterial, fmt.Errorf("reading known_hosts %s: %w", s.KnownHostsFile, err))
	}
	return &ssh.ClientConfig{User: s.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hk, Timeout: timeout}, nil
}

// link is one SSH connection to a host with the libvirt socket forwarded
// and a libvirt connection over it.
type link struct {
	host   string
	client *ssh.Client
	lv     *libvirt.Libvirt

	mu     sync.Mutex
	dead   bool
	reason string
	closed chan struct{}
}

// kill marks the link dead and closes the SSH client. The client, not the
// forwarded channel: closing a channel writes a message under a lock that a
// stalled upload may hold, while closing the client's net.Conn takes no lock
// and unblocks every reader and writer. The close runs outside the mutex, so
// concurrent killers never queue behind a slow one.
func (l *link) kill(reason string) {
	l.mu.Lock()
	if l.dead {
		l.mu.Unlock()
		return
	}
	l.dead, l.reason = true, reason
	close(l.closed)
	l.mu.Unlock()
	_ = l.client.Close()
}

func (l *link) alive() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return false
	}
	return l.lv.IsConnected()
}

// dial opens a link to addr under budget.
func dial(ctx context.Context, login sshLogin, hostName, addr string, budget time.Duration) (*link, error) {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	fail := func(stage string, err error) error {
		return &dialError{host: hostName, stage: stage, err: err}
	}
	cfg, err := login.clientConfig(budget)
	if err != nil {
		return nil, fail(stageMaterial, err)
	}
	var d net.Dialer
	tcp, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fail(stageTCP, classifySSH(stageTCP, err))
	}
	deadline, _ := ctx.Deadline()
	_ = tcp.SetDeadline(deadline)
	c, chans, reqs, err := ssh.NewClientConn(tcp, addr, cfg)
	if err != nil {
		_ = tcp.Close()
		return nil, fail(stageHandshake, classifySSH(stageHandshake, err))
	}
	client := ssh.NewClient(c, chans, reqs)
	// The deadline stays on the TCP conn until libvirt answered, so a host
	// that accepts and then hangs cannot hold the dial past its budget.
	sock, err := client.Dial("unix", login.Socket)
	if err != nil {
		_ = client.Close()
		return nil, fail(stageSocket, fmt.Errorf("%w: forwarding %s: %v", providers.ErrTransient, login.Socket, err))
	}
	lv := libvirt.NewWithDialer(dialers.NewAlreadyConnected(sock))
	done := make(chan error, 1)
	go func() { done <- lv.ConnectToURI(libvirt.QEMUSystem) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = client.Close()
		<-done
		err = ctx.Err()
	}
	if err != nil {
		_ = client.Close()
		return nil, fail(stageConnect, classify("connecting to libvirt", err))
	}
	_ = tcp.SetDeadline(time.Time{})
	l := &link{host: hostName, client: client, lv: lv, closed: make(chan struct{})}
	go l.keepalive()
	return l, nil
}

// keepalive drops the link when the peer stops answering SSH keepalives, so
// a vanished host is noticed without waiting for TCP retransmission.
func (l *link) keepalive() {
	t := time.NewTicker(keepaliveInterval)
	defer t.Stop()
	for {
		select {
		case <-l.closed:
			return
		case <-t.C:
			res := make(chan error, 1)
			go func() {
				_, _, err := l.client.SendRequest("keepalive@openssh.com", true, nil)
				res <- err
			}()
			select {
			case err := <-res:
				if err != nil {
					l.kill("keepalive failed: " + err.Error())
					return
				}
			case <-time.After(keepaliveInterval):
				l.kill("keepalive unanswered")
				return
			case <-l.closed:
				return
			}
		}
	}
}

// hostConn is the pooled connection of one host. The slot is a one-slot
// channel rather than a mutex so that waiting for it (while another caller
// redials a dead host) ends with the waiter's context.
type hostConn struct {
	name, addr string
	slot       chan struct{}
	cur        *link
}

func newHostConn(name, addr string) *hostConn {
	return &hostConn{name: name, addr: addr, slot: make(chan struct{}, 1)}
}

// get returns the live pooled link, dialing one when there is none.
func (h *hostConn) get(ctx context.Context, login sshLogin, budget time.Duration, log logr.Logger) (*link, error) {
	select {
	case h.slot <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for the connection to host %s: %v", providers.ErrTransient, h.name, ctx.Err())
	}
	defer func() { <-h.slot }()
	if h.cur != nil && h.cur.alive() {
		return h.cur, nil
	}
	if h.cur != nil {
		log.V(1).Info("libvirt connection dropped, redialing", "host", h.name, "reason", h.cur.reason)
		h.cur.kill("replaced")
	}
	l, err := dial(ctx, login, h.name, h.addr, budget)
	if err != nil {
		h.cur = nil
		return nil, err
	}
	log.V(1).Info("libvirt connected", "host", h.name)
	h.cur = l
	return l, nil
}

// closeAll kills the pooled link, if any.
func (h *hostConn) closeAll() {
	h.slot <- struct{}{}
	defer func() { <-h.slot }()
	if h.cur != nil {
		h.cur.kill("closed")
		h.cur = nil
	}
}

// runV calls fn on l under budget and ctx and returns what fn returned. A
// call that outlives either kills the link and returns Transient (other
// calls in flight on the link fail once with Transient and their callers
// retry); fn keeps running until go-libvirt lets go of it, so fn must not
// touch anything but its own locals and what it returns — its results
// travel back only through the channel. An error that is neither a libvirt
// answer nor one fn already classified is a transport failure: the link is
// killed, so the next call redials. A libvirt answer is returned as it is,
// for the caller to judge.
//
// Each call is one span, libvirt.<op>, a child of the caller's (the
// provider call's) span.
func runV[T any](ctx context.Context, l *link, op string, budget time.Duration, fn func(api) (T, error)) (v T, err error) {
	ctx, span := tracer.Start(ctx, "libvirt."+op, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("rpc.system", "libvirt"), attribute.String("rpc.method", op), attribute.String("server.address", l.host)))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "")
		}
		span.End()
	}()
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn(l.lv)
		done <- result{v, err}
	}()
	var zero T
	select {
	case r := <-done:
		if r.err == nil {
			return r.v, nil
		}
		if _, ok := libvirtCode(r.err); ok || hasSentinel(r.err) {
			return r.v, r.err
		}
		l.kill(op + ": " + r.err.Error())
		return zero, fmt.Errorf("%w: %s on host %s: connection lost: %v", providers.ErrTransient, op, l.host, r.err)
	case <-ctx.Done():
		l.kill(op + " outlived its budget")
		return zero, fmt.Errorf("%w: %s on host %s did not finish within its budget or the caller's deadline (%v); the connection was closed to unblock it", providers.ErrTransient, op, l.host, ctx.Err())
	}
}

// eofReader feeds an upload. A source error becomes io.EOF — the one
// outcome that ends go-libvirt's upload stream the normal way (its error
// path deadlocks) — and is kept for the caller, who then discards the volume.
type eofReader struct {
	r   io.Reader
	err error
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		e.err = err
		return n, io.EOF
	}
	return n, err
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
