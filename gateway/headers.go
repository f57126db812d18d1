package gateway

import "github.com/proxyfleet/proxyfleet/gateway/params"

// Header names a client uses to talk to the gateway instead of (or besides)
// username parameters (read by package params, named here too so a user of
// the gateway finds every X-Proxyfleet-* header in one place), and the ones
// the gateway sets on its answers. Every X-Proxyfleet-* request header is
// stripped before forwarding.
const (
	// HeaderSession names the sticky session (same as the `session` parameter).
	HeaderSession = params.HeaderSession
	// HeaderSelect is an attribute selector list: `region=eu,tier=dc`.
	HeaderSelect = params.HeaderSelect
	// HeaderProxy pins the request to one member by name (the `proxy` parameter).
	HeaderProxy = params.HeaderProxy
	// HeaderRotate is `sticky` or `request` (the `rotate` parameter).
	HeaderRotate = params.HeaderRotate
	// HeaderSessTTL is how long the session keeps its member (the `sessttl` parameter).
	HeaderSessTTL = params.HeaderSessTTL
	// HeaderPace is the client's own pace for the site (the `pace`
	// parameter): a duration between two requests through one member,
	// met with the operator's (the stricter wins).
	HeaderPace = params.HeaderPace
	// HeaderStrict set to 1 keeps the session on its member: when the
	// member is banned, fails or leaves, the request fails session_lost
	// instead of moving (the `strict` parameter).
	HeaderStrict = params.HeaderStrict
	// HeaderLease is set on every answer (and the CONNECT 200): the lease ID
	// a crawler can report on through the lease API.
	HeaderLease = "X-Proxyfleet-Lease"
	// HeaderAttempts is set on every relayed answer, on the CONNECT 200 and
	// on the gateway's own answers after it tried members: how many members
	// the request went through, so a crawler sees the retries it did not make.
	HeaderAttempts = "X-Proxyfleet-Attempts"
	// HeaderTier is set on every relayed answer and on the CONNECT 200
	// when the gateway has tiers (--tiers): the tier of the member that
	// carried it.
	HeaderTier = "X-Proxyfleet-Tier"
	// HeaderMITM on a CONNECT set to "off" keeps that tunnel a plain one
	// when MITM is on (a pinned or mutual-TLS site); the gateway's own 200
	// to a MITM'd CONNECT carries "on".
	HeaderMITM = "X-Proxyfleet-Mitm"
	// HeaderFingerprint on a CONNECT (for its tunnel) or on a request
	// inside a MITM tunnel (for that request) chooses the site-facing TLS
	// handshake: "mirror" (the client's ClientHello) or "go" (Go's
	// crypto/tls, with connections pooled across clients), overriding
	// MITMOptions.Fingerprint.
	HeaderFingerprint = "X-Proxyfleet-Fingerprint"
	// HeaderReason is set on answers the gateway itself produced (407, 403,
	// 503, 502...): a short machine-readable cause.
	HeaderReason = "X-Proxyfleet-Reason"

	headerPrefix = params.HeaderPrefix
)
