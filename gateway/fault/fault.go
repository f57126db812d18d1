package fault

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Attempt is one failed attempt through a member, classified where it
// happened (the dial, the handshake, the upstream's answer), so the request
// loop decides from the verdict alone what the failure takes out of service.
type Attempt struct {
	F   rotation.Failure
	Err error
	// Firsthand: the gateway itself dialled the site from a direct member
	// (or verified its certificate itself), so a FaultSite verdict is
	// certain and no other member is tried.
	Firsthand bool
}

func (e *Attempt) Error() string { return e.Err.Error() }
func (e *Attempt) Unwrap() error { return e.Err }

// Member and Site wrap err with a verdict.
func Member(class string, err error) error {
	return &Attempt{F: rotation.Member(class), Err: err}
}

// Site wraps err with the site's verdict f.
func Site(f rotation.Failure, err error) error { return &Attempt{F: f, Err: err} }

// Of returns err's verdict. An error nobody classified is the member's:
// only a positive answer about the site spares the member.
func Of(err error) *Attempt {
	var ae *Attempt
	if errors.As(err, &ae) {
		return ae
	}
	return &Attempt{F: rotation.Member("error"), Err: err}
}

// AsAttempt makes the error of a dial or round trip through a member a
// verdict judge can read: a refused target stays what it is, a classified
// failure keeps its verdict, and anything nobody classified is the member's.
func AsAttempt(err error) error {
	var te *Target
	if errors.As(err, &te) {
		return err
	}
	return Of(err)
}

// Answer is an upstream that is up but answered with a non-2xx status of
// its own (to our CONNECT, or a plain-HTTP answer it marked as its own).
type Answer struct {
	Status  int
	Line    string
	UE      rotation.UpstreamError
	Connect bool // an answer to our CONNECT
}

func (e *Answer) Error() string {
	s := "answered " + e.Line
	if e.Connect {
		s = "answered CONNECT with " + e.Line
	}
	if r := e.UE.Reason(); r != "" {
		s += " (" + r + ")"
	}
	return s
}

// Target is a refused or unresolvable target; Reason is the answer.
type Target struct {
	Reason string
	Msg    string
}

func (e *Target) Error() string { return e.Msg }

// Client is an error that came from the client: its body's framing, a
// body that ended early, a client that stalled or went away. It is made
// where the client's bytes are read (the request's client body), so no
// later step can take it for the member's: judge answers it before
// anything else, and it rests nothing, reports nothing and counts no
// member failure.
type Client struct {
	// Reason is the answer's X-Proxyfleet-Reason; "" writes none (the
	// client is gone).
	Reason string
	// Outcome is the request metric's outcome.
	Outcome string
	Err     error
}

func (e *Client) Error() string { return e.Err.Error() }
func (e *Client) Unwrap() error { return e.Err }

// ErrClientGone: the client left before its answer.
var ErrClientGone error = &Client{Outcome: OutcomeClientGone, Err: errors.New("the client went away")}

// ClientRead classifies an error reading the client's request body: a
// timeout is the client's stall (408), an early end of the stream a client
// that hung up mid-body (an answer is still tried: it may only have closed
// its sending side), any other network error a client that is gone, and
// anything else (net/http's chunk parser: a size that is not hex or
// overflows, a bare LF, a malformed chunk end) a malformed body (400).
func ClientRead(err error, read int64) *Client {
	switch {
	case IsTimeout(err):
		return &Client{Reason: ReasonClientTimeout, Outcome: ReasonClientTimeout,
			Err: errors.New("the client stopped sending its request body after " + strconv.FormatInt(read, 10) + " bytes")}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &Client{Reason: ReasonBadRequest, Outcome: OutcomeClientGone,
			Err: errors.New("the request body ended after " + strconv.FormatInt(read, 10) + " bytes, before its announced end")}
	case errors.As(err, new(*net.OpError)), errors.Is(err, net.ErrClosed):
		return &Client{Outcome: OutcomeClientGone, Err: errors.New("the client went away while sending its request body: " + err.Error())}
	}
	return &Client{Reason: ReasonBadRequest, Outcome: ReasonBadRequest,
		Err: errors.New("malformed request body: " + err.Error())}
}

// IsTimeout reports a deadline that passed.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// SiteFailure is one member's answer, in this request, that it could not
// reach the target.
type SiteFailure struct {
	Member  string
	LeaseID string
	Class   string
	Msg     string
}

// SiteFailures collects a request's site-level failures: they decide when
// to stop trying members (the same failure on two members is the site's)
// and, once another member reaches the site, feed MemberEvidence.
type SiteFailures []SiteFailure

// Add records a failure and reports whether the site has now failed the
// same way on two members.
func (s *SiteFailures) Add(member, leaseID string, f rotation.Failure, err error) (same bool) {
	for _, p := range *s {
		if p.Class == f.Class {
			same = true
		}
	}
	*s = append(*s, SiteFailure{Member: member, LeaseID: leaseID, Class: f.Class, Msg: err.Error()})
	return same
}

// Message says what every member said, for the client's 502.
func (s SiteFailures) Message(hostport string) string {
	var b strings.Builder
	b.WriteString("cannot reach " + echo.Quote(hostport) + ": ")
	for i, f := range s {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString("upstream " + f.Member + " " + f.Msg)
	}
	return b.String()
}

// ClassAnswerTimeout is the failure class of a member that did not answer
// an attempt within its answer timeout. One such silence is the site's (a
// member waits on a slow site as long as it must): the {member, site} pair
// rests, and two members silent on one site end the request. Whether the
// member itself is dead is asked separately (the gateway's checkAlive).
const ClassAnswerTimeout = "answer_timeout"

// ErrAnswerTimeout is the cause of an attempt its answer timeout ended.
var ErrAnswerTimeout = errors.New("member answer timeout")

// AnswerTimedOut is the verdict of an attempt whose member did not answer
// within d.
func AnswerTimedOut(d time.Duration, what string) error {
	return Site(rotation.Site(ClassAnswerTimeout), errors.New("gave no answer to "+what+" within "+d.String()))
}

// ClassCertificate is the failure class of a site certificate that does not verify.
const ClassCertificate = "certificate"

// SiteCertificate is a site certificate that did not verify on the
// gateway's own TLS to the site: the site's, certain, answered 502
// site_certificate and never retried (every member carries the same one).
func SiteCertificate(host string, err error) error {
	return &Attempt{F: rotation.Site(ClassCertificate), Firsthand: true,
		Err: errors.New("the certificate of " + echo.Quote(host) + " does not verify: " + certErrorText(err))}
}

// IsCertError reports a certificate that did not verify.
func IsCertError(err error) bool {
	var (
		cve *tls.CertificateVerificationError
		ua  x509.UnknownAuthorityError
		he  x509.HostnameError
		ci  x509.CertificateInvalidError
	)
	return errors.As(err, &cve) || errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci)
}

// certErrorText is the verification error without the transport's wrapping.
func certErrorText(err error) string {
	var cve *tls.CertificateVerificationError
	if errors.As(err, &cve) && cve.Err != nil {
		return cve.Err.Error()
	}
	return err.Error()
}

// Annotated is Err with a message meant for the client.
type Annotated struct {
	Err error
	Msg string
}

func (e *Annotated) Error() string { return e.Msg }
func (e *Annotated) Unwrap() error { return e.Err }
