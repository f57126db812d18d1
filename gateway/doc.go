// Package gateway is proxyfleet's forward proxy: it authenticates crawlers,
// reads their username parameters, leases an upstream member per (session,
// target) from a pool, chains CONNECT and plain HTTP through it, reads
// answers as rotation feedback and retries on another member where safe.
//
// It is a small http.Handler with explicit hooks (a pool, a resolver, a
// recorder) and nothing global, served on the proxy port by its own
// HTTP/1.1 loop (gateway/front: one goroutine per connection, net/http's
// request parser, no per-request background read); it never reads
// HTTP(S)_PROXY from its own environment.
//
// Inside, the request path is a chain of stages, each a type with its own
// state made from Options with only what it uses: admission, leasing,
// pacing, member links, the exchange over a link, judge (the one policy),
// member health and the finisher (the one exit); a tunnel once up is
// gateway/relay's. requestPath (path.go) reads the path top-down, one
// function per protocol on the one retry loop (tryMembers), and Gateway is
// the wiring. A stage that needs none of the others is a package of its
// own (admission, link, health, sitelink; fault is the failure vocabulary
// they share). docs/architecture.md has a paragraph per stage.
//
// Behaviour worth knowing:
//
//   - CONNECT is allowed to any port; the upstream Squids' own rules decide
//     which ports they tunnel to (but see ConnectHTTPPorts below). Direct members tunnel to any port of a
//     target that passed the private-range check.
//   - A CONNECT whose upstream cannot be dialled (refused, timeout, TLS or
//     SOCKS handshake failure, 407 to our credentials) is retried on another
//     member while the pool offers one. An upstream that answers CONNECT
//     with another non-2xx status (or a SOCKS5 failure reply) is counted as failed too, but only
//     Options.Retries further members are tried for that request, so one
//     client asking for an unreachable site cannot take the whole pool out.
//   - A direct member counts as failed only when its own source address is
//     unusable (EADDRNOTAVAIL, out of ports). A site that refuses, resets
//     or times out is answered 502 target_unreachable and takes no member
//     out of service.
//   - Plain-HTTP answers are read with the Classifier; a 407 from an
//     upstream member is that member's failure (wrong credentials), never
//     delivered. Only idempotent requests without a body are replayed.
//   - The gateway adds no Via or X-Forwarded-For header; it strips
//     hop-by-hop headers, Proxy-Authorization and every X-Proxyfleet-*
//     header before forwarding, and drops a site's own X-Proxyfleet-*
//     answer headers. Upgrade is hop-by-hop and dropped, except a WebSocket
//     handshake (upgrade.go): carried to the site through the member, after
//     101 relayed as a tunnel; ws:// and wss:// in the request line read as
//     http:// and https://.
//   - A member gets MemberAnswerTimeout (per site SiteAnswerTimeouts) to
//     answer each attempt. A silence rests the {member, site} pair and the
//     request goes on to another member (plain HTTP: idempotent requests
//     only; else 504 member_timeout); in the background the member is
//     asked for an answer that needs no site (checkAlive), and one that
//     gives none is out for every site at once.
//   - What the client's own bytes or behaviour caused (a header name that
//     is not a token, a body's framing, a body cut short, a stall mid-body,
//     a client that left) is the client's: gateway/clientbody types the errors
//     where the body is read, judge answers them first (400, 408 or
//     nothing), and no member rests or is reported. A body of up to 64 KiB
//     is read whole before a member is leased; a chunked request ends its
//     connection after the answer.
//   - Answers the gateway produces itself carry X-Proxyfleet-Reason:
//     auth, bad_params, bad_request, client_timeout, private_target, loop, dns,
//     target_unreachable, site_certificate, no_member, pool_unreachable,
//     pool_error, upstream_failed, timeout, member_timeout, shutting_down,
//     paced, session_lost, session_limit, gateway_overloaded, internal.
//   - Tiers (Options.Tiers, gateway/tiering): with more than one, a request
//     starts on its site's tier (the member attribute tier added to its
//     selector), goes one tier up when its tier has no usable member, and
//     its bans and served probes move the site (docs/tiers.md); relayed
//     answers carry X-Proxyfleet-Tier.
//   - Pacing (Options.Pacing, gateway/pacing) is a step of tryMembers: before each
//     attempt the request waits for its site's place in flight and its
//     member's next slot, or takes another member free sooner, or ends 503
//     paced after MaxWait; the automatic slow-down (rotation.LearntPace) is
//     fed where an answer is classified, before a ban's retry is leased. A
//     strict session (strict-1) never moves: its member's ban, failure or
//     departure is 502 session_lost, for this and its later requests.
//   - Relayed answers, the CONNECT 200 and the gateway's own answers after
//     it tried a member carry X-Proxyfleet-Attempts: the members tried.
//   - Answers are classified by Options.Classifier: its ban rules first
//     (a body is read ahead, up to Options.BanBodyBytes, only when a rule
//     needs it, and delivered unchanged), then its status lists.
//   - With Options.MITM a CONNECT (not bypassed, no X-Proxyfleet-Mitm:
//     off) is answered by the gateway itself, the client's TLS terminated
//     with a leaf for the CONNECT's host (CA.leafFor: cached, minted once
//     under concurrency), and each HTTP/1.1 request inside is served by a
//     second net/http server through forward, the plain-HTTP path; the
//     site's certificate is verified against Options.SiteRoots.
//   - A CONNECT to a port in Options.ConnectHTTPPorts (80 by default; no
//     X-Proxyfleet-Mitm: off) is answered by the gateway too, MITM or not,
//     and the plain HTTP/1.1 inside served by that second server the same
//     way (inner.go): browsers open ws:// through a proxy with CONNECT,
//     which Squids refuse for any port but 443.
//   - Recorder.Request is called once per plain request when its answer
//     head is written, and once per CONNECT when the tunnel is up (its
//     duration is the setup time); tunnel bytes are recorded when it ends.
//
// It imports rotation, pool, pool/lastknown, pool/leaseapi (the lease API
// client), statuspage, its own sub-packages and internal/bufpool and
// internal/keepalive; never metrics, pool/redisstore, controller or cmd: the
// wiring (gateway/daemon) gives it recorders and a store.
package gateway
