package pool

import "context"

// Client is who asks for egress: a pod identity, whose namespace a
// reviewed service-account token names, or a gateway's token client
// (--auth-token-file), whose line names it. Who may lease which member is
// decided by it (the controller's tenancy, docs/tenancy.md), and it is the
// one type that a token naming its client will also produce, so that
// refusals, quotas and reports per client have one key whichever way the
// caller authenticated. The zero Client is an unnamed caller: the
// operator's static token, or an API without authentication, which may
// lease every member as before.
type Client struct {
	// Namespace is the Kubernetes namespace of a pod identity; "" for a
	// caller that is not one.
	Namespace string
	// ServiceAccount is the pod's service account in Namespace, for logs
	// and messages.
	ServiceAccount string
	// Name is a token client's name (its --auth-token-file line); "" for
	// a pod identity.
	Name string
}

// IsZero reports whether c names nobody (the unrestricted caller).
func (c Client) IsZero() bool { return c == Client{} }

// String is "service account NS/NAME", "client NAME" for a token
// client, or "" for the zero Client.
func (c Client) String() string {
	switch {
	case c.IsZero():
		return ""
	case c.Name != "":
		return "client " + c.Name
	}
	return "service account " + c.Namespace + "/" + c.ServiceAccount
}

type clientKey struct{}

// WithClient returns ctx carrying c: the lease API puts the caller its
// authentication found there, so a backend can decide what c may lease.
func WithClient(ctx context.Context, c Client) context.Context {
	return context.WithValue(ctx, clientKey{}, c)
}

// ClientFrom is the Client WithClient put in ctx; the zero Client when none.
func ClientFrom(ctx context.Context) Client {
	c, _ := ctx.Value(clientKey{}).(Client)
	return c
}
