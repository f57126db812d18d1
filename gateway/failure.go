package gateway

import (
	"errors"
	"strings"

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// attemptError is one failed attempt through a member, classified where it
// happened (the dial, the handshake, the upstream's answer), so the request
// loop decides from the verdict alone what the failure takes out of service.
type attemptError struct {
	f   rotation.Failure
	err error
	// firsthand: the gateway itself dialled the site from a direct member,
	// so a FaultSite verdict is certain and no other member is tried.
	firsthand bool
}

func (e *attemptError) Error() string { return e.err.Error() }
func (e *attemptError) Unwrap() error { return e.err }

// memberFault and siteFault wrap err with a verdict.
func memberFault(class string, err error) error {
	return &attemptError{f: rotation.Member(class), err: err}
}

func siteFault(f rotation.Failure, err error) error { return &attemptError{f: f, err: err} }

// failureOf returns err's verdict. An error nobody classified is the
// member's: only a positive answer about the site spares the member.
func failureOf(err error) *attemptError {
	var ae *attemptError
	if errors.As(err, &ae) {
		return ae
	}
	return &attemptError{f: rotation.Member("error"), err: err}
}

// asAttempt makes the error of a dial or round trip through a member a
// verdict judge can read: a refused target stays what it is, a classified
// failure keeps its verdict, and anything nobody classified is the member's.
func asAttempt(err error) error {
	var te *targetError
	if errors.As(err, &te) {
		return err
	}
	return failureOf(err)
}

// answerError is an upstream that is up but answered with a non-2xx status
// of its own (to our CONNECT, or a plain-HTTP answer it marked as its own).
type answerError struct {
	status  int
	line    string
	ue      rotation.UpstreamError
	connect bool // an answer to our CONNECT
}

func (e *answerError) Error() string {
	s := "answered " + e.line
	if e.connect {
		s = "answered CONNECT with " + e.line
	}
	if r := e.ue.Reason(); r != "" {
		s += " (" + r + ")"
	}
	return s
}

// siteFailure is one member's answer, in this request, that it could not
// reach the target.
type siteFailure struct {
	member  string
	leaseID string
	class   string
	msg     string
}

// siteFailures collects a request's site-level failures: they decide when
// to stop trying members (the same failure on two members is the site's)
// and, once another member reaches the site, feed MemberEvidence.
type siteFailures []siteFailure

// add records a failure and reports whether the site has now failed the
// same way on two members.
func (s *siteFailures) add(member, leaseID string, f rotation.Failure, err error) (same bool) {
	for _, p := range *s {
		if p.class == f.Class {
			same = true
		}
	}
	*s = append(*s, siteFailure{member: member, leaseID: leaseID, class: f.Class, msg: err.Error()})
	return same
}

// message says what every member said, for the client's 502.
func (s siteFailures) message(hostport string) string {
	var b strings.Builder
	b.WriteString("cannot reach " + echo.Quote(hostport) + ": ")
	for i, f := range s {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString("upstream " + f.member + " " + f.msg)
	}
	return b.String()
}
