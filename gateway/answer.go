package gateway

import (
	"crypto/tls"
	"errors"
	"net/http"
	"net/url"

	"github.com/proxyfleet/proxyfleet/gateway/answerbody"
	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// readAnswer is the part of resp the classifier reads. When a ban rule
// needs the body for this head, the first Options.BanBodyBytes of it are
// read ahead and put back in front of resp.Body, so the client still gets
// the answer byte for byte; otherwise nothing is read and the body streams
// as before. An error reading ahead (the site broke off, the request
// deadline passed) ends the attempt like a failed round trip.
func (x *exchange) readAnswer(r *http.Request, resp *http.Response) (rotation.Answer, error) {
	a := rotation.Answer{Status: resp.StatusCode, Header: resp.Header}
	if !x.classifier.NeedsBody(resp.StatusCode, resp.Header) || r.Method == http.MethodHead {
		return a, nil
	}
	body, err := answerbody.Peek(resp, x.banBodyBytes)
	if err != nil {
		return a, err
	}
	a.Body, a.BodyRead = body, true
	return a, nil
}

// classifySiteTLS gives a failed https:// round trip whose TLS to the site
// did not verify its verdict: the site's, certain (the gateway verified the
// chain itself, against the system roots and --upstream-ca-file), answered
// 502 site_certificate and never retried, since every member would carry
// the same certificate. A certificate that fails through an https:// member
// and names that member is the member's own (the transport verifies both
// with one configuration), so it stays a member failure.
func classifySiteTLS(err error, mc *link.Link, u *url.URL) error {
	if u.Scheme != "https" || !fault.IsCertError(err) {
		return err
	}
	var cve *tls.CertificateVerificationError
	if mc.TLSConfig != nil && errors.As(err, &cve) && len(cve.UnverifiedCertificates) > 0 &&
		cve.UnverifiedCertificates[0].VerifyHostname(mc.TLSConfig.ServerName) == nil {
		return err
	}
	return fault.SiteCertificate(u.Host, err)
}
