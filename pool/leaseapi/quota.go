package leaseapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/quota"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// The quotas of a shared gateway's token clients over the lease API (POST
// /v1/quota): the server's lease store keeps them, so --lease-api gateways
// (the chart's shared gateway and its replicas) hold a client to one
// quota together. Each call is one pool.QuotaKeeper decision. Only the
// operator's static token (or an API without authentication) may call
// it: the client named is the gateway's, not the caller's, and a pod
// identity must not spend or free another client's quota.

// quotaRequest is the body of POST /v1/quota; op says which decision.
type quotaRequest struct {
	Op          string  `json:"op"` // request, bytes, lease, return
	Client      string  `json:"client"`
	Site        string  `json:"site,omitempty"`
	Holder      string  `json:"holder,omitempty"`
	Leases      int     `json:"leases,omitempty"`
	RPS         float64 `json:"rps,omitempty"`
	SiteRPS     float64 `json:"siteRps,omitempty"`
	BytesPerDay int64   `json:"bytesPerDay,omitempty"`
	Bytes       int64   `json:"bytes,omitempty"`
	TTLMillis   int64   `json:"ttlMillis,omitempty"`
}

// quotaRefusal is the body of a 429 quota_exceeded answer.
type quotaRefusal struct {
	apiErrorBody
	Which            string  `json:"which"`
	Limit            float64 `json:"limit"`
	RetryAfterMillis int64   `json:"retryAfterMillis"`
}

const apiErrQuota = "quota_exceeded"

// clientName is a token client's name (gateway/clients: a DNS label).
var clientName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// maxQuotaTTLMillis bounds a lease place's TTL (a day).
const maxQuotaTTLMillis = 24 * 60 * 60 * 1000

func (b *quotaRequest) limits() quota.Limits {
	return quota.Limits{Leases: b.Leases, RPS: b.RPS, SiteRPS: b.SiteRPS, BytesPerDay: b.BytesPerDay}
}

// checkQuota is what every op needs; a bad request is a sentence naming
// the field. It puts the site in its key form, as the gateway sends it.
func checkQuota(b *quotaRequest) error {
	if !clientName.MatchString(b.Client) {
		return errors.New("client must be a token client's name (a DNS label)")
	}
	if err := b.limits().Check(); err != nil {
		return err
	}
	switch b.Op {
	case "request":
		site, err := rotation.ParseTarget(b.Site)
		if b.Site == "" || err != nil {
			return errors.New("site must be a host (the request's target)")
		}
		b.Site = site
	case "bytes":
		if b.Bytes < 0 {
			return fmt.Errorf("bytes %d must not be negative", b.Bytes)
		}
	case "lease", "return":
		if b.Holder == "" || len(b.Holder) > 128 {
			return errors.New("holder must be an id of 1 to 128 bytes")
		}
		if b.TTLMillis < 0 || b.TTLMillis > maxQuotaTTLMillis {
			return fmt.Errorf("ttlMillis %d is out of range (0 to a day)", b.TTLMillis)
		}
	default:
		return fmt.Errorf("op %q: want request, bytes, lease or return", b.Op)
	}
	return nil
}

func (s *apiServer) quota(w http.ResponseWriter, r *http.Request) {
	if s.quotas == nil {
		writeError(w, http.StatusNotFound, apiErrNotFound, "this lease API keeps no quotas")
		return
	}
	if c := pool.ClientFrom(r.Context()); !c.IsZero() {
		writeError(w, http.StatusForbidden, apiErrForbidden, "quotas of token clients are kept for gateways on the static token; "+c.String()+" may not spend or free them")
		return
	}
	var b quotaRequest
	if !s.decodeBody(w, r, &b, false) {
		return
	}
	if err := checkQuota(&b); err != nil {
		writeError(w, http.StatusBadRequest, apiErrBadRequest, err.Error())
		return
	}
	ctx := r.Context()
	var err error
	switch b.Op {
	case "request":
		err = s.quotas.TakeRequest(ctx, b.Client, b.Site, b.limits())
	case "bytes":
		err = s.quotas.AddBytes(ctx, b.Client, b.Bytes)
	case "lease":
		err = s.quotas.TakeLease(ctx, b.Client, b.Holder, b.limits(), time.Duration(b.TTLMillis)*time.Millisecond)
	case "return":
		err = s.quotas.ReturnLease(ctx, b.Client, b.Holder)
	}
	var ref *quota.Refusal
	switch {
	case errors.As(err, &ref):
		w.Header().Set("Retry-After", strconv.FormatInt(ref.RetryAfterSeconds(), 10))
		writeJSON(w, http.StatusTooManyRequests, quotaRefusal{apiErrorBody: apiErrorBody{Error: apiErrQuota, Message: ref.Error()},
			Which: string(ref.Which), Limit: ref.Limit, RetryAfterMillis: ref.RetryAfter.Milliseconds()})
	case err != nil:
		s.backendFailed(w, "quota "+b.Op, err)
	default:
		writeJSON(w, http.StatusOK, struct{}{})
	}
}

// quota is one POST /v1/quota; a 429 is the server's *quota.Refusal.
func (c *Client) quota(ctx context.Context, b quotaRequest) error {
	status, raw, err := c.do(ctx, http.MethodPost, "/v1/quota", b)
	if err != nil {
		return err
	}
	switch status {
	case http.StatusOK:
		return nil
	case http.StatusTooManyRequests:
		var out quotaRefusal
		if err := json.Unmarshal(raw, &out); err != nil || out.Error != apiErrQuota {
			return apiError(status, raw)
		}
		return &quota.Refusal{Which: quota.Which(out.Which), Limit: out.Limit, RetryAfter: time.Duration(out.RetryAfterMillis) * time.Millisecond}
	}
	return apiError(status, raw)
}

// TakeRequest is pool.QuotaKeeper.TakeRequest, decided by the server's store.
func (c *Client) TakeRequest(ctx context.Context, client, site string, l quota.Limits) error {
	return c.quota(ctx, quotaRequest{Op: "request", Client: client, Site: site, RPS: l.RPS, SiteRPS: l.SiteRPS, BytesPerDay: l.BytesPerDay})
}

// AddBytes is pool.QuotaKeeper.AddBytes.
func (c *Client) AddBytes(ctx context.Context, client string, n int64) error {
	return c.quota(ctx, quotaRequest{Op: "bytes", Client: client, Bytes: n})
}

// TakeLease is pool.QuotaKeeper.TakeLease.
func (c *Client) TakeLease(ctx context.Context, client, holder string, l quota.Limits, ttl time.Duration) error {
	return c.quota(ctx, quotaRequest{Op: "lease", Client: client, Holder: holder, Leases: l.Leases, TTLMillis: ceilMillis(ttl)})
}

// ReturnLease is pool.QuotaKeeper.ReturnLease.
func (c *Client) ReturnLease(ctx context.Context, client, holder string) error {
	return c.quota(ctx, quotaRequest{Op: "return", Client: client, Holder: holder})
}
