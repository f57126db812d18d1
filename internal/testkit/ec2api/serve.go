package ec2api

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// serve answers one Query-protocol request: a form-encoded POST whose
// Action names the call, checked for its signature, failed or held as the
// test asked, else carried out and answered in EC2's XML.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, Error{Status: 400, Code: "InvalidAction", Message: "EC2 takes form-encoded POSTs"})
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, Error{Status: 400, Code: "MalformedQueryString", Message: err.Error()})
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		writeError(w, Error{Status: 400, Code: "MalformedQueryString", Message: err.Error()})
		return
	}
	action := form.Get("Action")
	s.mu.Lock()
	s.calls = append(s.calls, Call{Action: action, Form: form, Authorization: r.Header.Get("Authorization")})
	if e, ok := s.authenticate(r, body); !ok {
		s.mu.Unlock()
		writeError(w, e)
		return
	}
	if form.Get("Version") != "2016-11-15" {
		s.mu.Unlock()
		writeError(w, Error{Status: 400, Code: "InvalidParameterValue", Message: "unsupported API version " + form.Get("Version")})
		return
	}
	if e, ok := s.Before(action); ok {
		s.mu.Unlock()
		writeError(w, e)
		return
	}
	answer, e := s.do(action, form)
	var (
		after *Error
		hang  bool
	)
	if e == nil {
		after, hang = s.After(action)
	}
	s.mu.Unlock()
	switch {
	case e != nil:
		writeError(w, *e)
	case after != nil:
		writeError(w, *after)
	case hang:
		// The action took effect; its answer is lost. Hold the request
		// until the client gives up or the server closes.
		<-r.Context().Done()
	default:
		w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
		_, _ = w.Write([]byte(xml.Header))
		_ = xml.NewEncoder(w).Encode(answer)
	}
}

// authenticate checks the request's SigV4 signature as AWS does before
// anything else: an Authorization header whose credential scope names a
// known access key, this region and ec2, and whose signature is the one
// that key's secret gives the request.
func (s *Server) authenticate(r *http.Request, body []byte) (Error, bool) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return Error{Status: 401, Code: "MissingAuthenticationToken", Message: "Request is missing Authentication Token"}, false
	}
	const alg = "AWS4-HMAC-SHA256 Credential="
	if !strings.HasPrefix(auth, alg) || !strings.Contains(auth, "SignedHeaders=") || !strings.Contains(auth, "Signature=") {
		return Error{Status: 400, Code: "IncompleteSignature", Message: "Authorization header requires 'Credential', 'Signature' and 'SignedHeaders'"}, false
	}
	cred, _, _ := strings.Cut(strings.TrimPrefix(auth, alg), ",")
	parts := strings.Split(cred, "/")
	if len(parts) != 5 || s.keys[parts[0]] == "" {
		return Error{Status: 401, Code: "AuthFailure", Message: "AWS was not able to validate the provided access credentials"}, false
	}
	if parts[2] != s.Region || parts[3] != "ec2" || parts[4] != "aws4_request" {
		return Error{Status: 401, Code: "AuthFailure", Message: fmt.Sprintf("Credential should be scoped to a valid region (%s), service ec2", s.Region)}, false
	}
	date := r.Header.Get("X-Amz-Date")
	if date == "" || !strings.HasPrefix(date, parts[1]) {
		return Error{Status: 400, Code: "IncompleteSignature", Message: "X-Amz-Date header missing or not of the credential's day"}, false
	}
	if sigV4(r, body, auth, s.keys[parts[0]], strings.Join(parts[1:], "/"), date) {
		return Error{}, true
	}
	return Error{Status: 401, Code: "AuthFailure", Message: "AWS was not able to validate the provided access credentials"}, false
}

// sigV4 recomputes the request's AWS Signature Version 4 with secret and
// compares it with the one in auth.
func sigV4(r *http.Request, body []byte, auth, secret, scope, date string) bool {
	field := func(name string) string {
		i := strings.Index(auth, name+"=")
		if i < 0 {
			return ""
		}
		v, _, _ := strings.Cut(auth[i+len(name)+1:], ",")
		return strings.TrimSpace(v)
	}
	signed, signature := field("SignedHeaders"), field("Signature")
	var canon strings.Builder
	for _, h := range strings.Split(signed, ";") {
		var v string
		switch h {
		case "host":
			v = r.Host
		case "content-length":
			v = strconv.FormatInt(r.ContentLength, 10)
		default:
			v = strings.Join(r.Header.Values(h), ",")
		}
		canon.WriteString(h + ":" + strings.Join(strings.Fields(v), " ") + "\n")
	}
	payload := sha256.Sum256(body)
	path := r.URL.EscapedPath()
	if path == "" {
		path = "/"
	}
	request := strings.Join([]string{r.Method, path, r.URL.RawQuery, canon.String(), signed, hex.EncodeToString(payload[:])}, "\n")
	reqHash := sha256.Sum256([]byte(request))
	toSign := "AWS4-HMAC-SHA256\n" + date + "\n" + scope + "\n" + hex.EncodeToString(reqHash[:])
	key := []byte("AWS4" + secret)
	for _, part := range strings.Split(scope, "/") {
		key = hmacSHA256(key, part)
	}
	return hmac.Equal([]byte(hex.EncodeToString(hmacSHA256(key, toSign))), []byte(signature))
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

// do carries out action under s.mu and returns its answer body.
func (s *Server) do(action string, f url.Values) (any, *Error) {
	switch action {
	case RunInstances:
		return s.runInstances(f)
	case DescribeInstances:
		return s.describeInstances(f)
	case TerminateInstances:
		return s.terminateInstances(f)
	case DescribeImages:
		return s.describeImages(f)
	case DescribeSecurityGroups:
		return s.describeSecurityGroups(f)
	case CreateSecurityGroup:
		return s.createSecurityGroup(f)
	case AuthorizeSecurityGroupIngress:
		return s.changeIngress(f, true)
	case RevokeSecurityGroupIngress:
		return s.changeIngress(f, false)
	}
	return nil, &Error{Status: 400, Code: "InvalidAction", Message: "The action " + action + " is not valid for this web service."}
}

func badParam(format string, args ...any) *Error {
	return &Error{Status: 400, Code: "InvalidParameterValue", Message: fmt.Sprintf(format, args...)}
}

const xmlns = "http://ec2.amazonaws.com/doc/2016-11-15/"

func writeError(w http.ResponseWriter, e Error) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(e.Status)
	_, _ = fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>ea966190-f9aa-478e-9ede-example</RequestID></Response>`,
		xmlEscape(e.Code), xmlEscape(e.Message))
}

func xmlEscape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
