package inject

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Keys of the self-managed certificate Secret.
const (
	// SecretCACert holds the CA bundle (the current CA first, then a
	// previous one still valid during a CA rollover).
	SecretCACert = "ca.crt"
	// SecretCAKey is the current CA's key; it never leaves the Secret.
	SecretCAKey = "ca.key"
)

// Lifetimes of the self-managed certificates, and when they are renewed.
const (
	CAValidity         = 10 * 365 * 24 * time.Hour
	CARenewBefore      = 365 * 24 * time.Hour
	ServingValidity    = 365 * 24 * time.Hour
	ServingRenewBefore = 30 * 24 * time.Hour
)

// SelfManaged keeps the webhook's CA and serving certificate in a Secret
// (creating and renewing them; replicas share it, optimistic concurrency
// decides races) and the caBundle of every webhook in the named
// MutatingWebhookConfiguration current. It runs on every replica.
type SelfManaged struct {
	// Client reads and writes the Secret and the configuration.
	Client client.Client
	// Secret is where the CA and the serving certificate live.
	Secret types.NamespacedName
	// Configuration is the MutatingWebhookConfiguration whose caBundle is kept.
	Configuration string
	// Hosts are the serving certificate's DNS names and IP addresses.
	Hosts []string
	// Interval is how often the Secret and the caBundle are re-checked (default 1m).
	Interval time.Duration
	// Log gets renewals, patches and failures.
	Log logr.Logger

	cert      atomic.Pointer[tls.Certificate]
	readyOnce sync.Once
	ready     chan struct{}
	initOnce  sync.Once
}

func (m *SelfManaged) init() {
	m.initOnce.Do(func() { m.ready = make(chan struct{}) })
}

// GetCertificate is the TLS server's certificate callback.
func (m *SelfManaged) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := m.cert.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("webhook serving certificate not loaded yet")
}

// Ready is closed once the first certificate is loaded.
func (m *SelfManaged) Ready() <-chan struct{} {
	m.init()
	return m.ready
}

// NeedLeaderElection is false: every replica serves and needs the certificate.
func (m *SelfManaged) NeedLeaderElection() bool { return false }

// Start syncs now and then every Interval until ctx ends. Failures are
// logged and retried; they do not stop the controller.
func (m *SelfManaged) Start(ctx context.Context) error {
	m.init()
	every := m.Interval
	if every <= 0 {
		every = time.Minute
	}
	for {
		wait := every
		if err := m.Sync(ctx, time.Now()); err != nil {
			m.Log.Error(err, "sidecar injection certificates", "secret", m.Secret.String(), "configuration", m.Configuration)
			wait = min(every, 5*time.Second)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// Sync makes the Secret hold a valid CA and serving certificate (as of
// now), loads the certificate, and patches any caBundle that differs.
func (m *SelfManaged) Sync(ctx context.Context, now time.Time) error {
	m.init()
	if len(m.Hosts) == 0 {
		return errors.New("no serving certificate hosts (--webhook-cert-hosts)")
	}
	sec := &corev1.Secret{}
	err := m.Client.Get(ctx, m.Secret, sec)
	switch {
	case apierrors.IsNotFound(err):
		sec = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: m.Secret.Name, Namespace: m.Secret.Namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "proxyfleet"}},
			Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{},
		}
		if err := m.renew(sec, now); err != nil {
			return err
		}
		if err := m.Client.Create(ctx, sec); err != nil {
			if apierrors.IsAlreadyExists(err) { // another replica was first: use its
				return m.Sync(ctx, now)
			}
			return fmt.Errorf("creating Secret %s: %w", m.Secret, err)
		}
		m.Log.Info("created the webhook CA and serving certificate", "secret", m.Secret.String())
	case err != nil:
		return fmt.Errorf("reading Secret %s: %w", m.Secret, err)
	default:
		if m.due(sec, now) {
			if sec.Data == nil {
				sec.Data = map[string][]byte{}
			}
			if err := m.renew(sec, now); err != nil {
				return err
			}
			if err := m.Client.Update(ctx, sec); err != nil { // a conflict: the next pass reads the winner's
				return fmt.Errorf("renewing the certificates in Secret %s: %w", m.Secret, err)
			}
			m.Log.Info("renewed the webhook serving certificate", "secret", m.Secret.String())
		}
	}
	pair, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return fmt.Errorf("Secret %s: serving certificate: %w", m.Secret, err)
	}
	m.cert.Store(&pair)
	m.readyOnce.Do(func() { close(m.ready) })
	return m.patchCABundle(ctx, sec.Data[SecretCACert])
}

// due reports whether the Secret's certificates must be (re)made: missing,
// unreadable, expiring, for other hosts, or not signed by the current CA.
func (m *SelfManaged) due(sec *corev1.Secret, now time.Time) bool {
	ca, _, err := parseCA(sec.Data[SecretCACert], sec.Data[SecretCAKey])
	if err != nil || now.Add(CARenewBefore).After(ca.NotAfter) {
		return true
	}
	leaf, err := parseCert(sec.Data[corev1.TLSCertKey])
	if err != nil || now.Add(ServingRenewBefore).After(leaf.NotAfter) {
		return true
	}
	if _, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]); err != nil {
		return true
	}
	if leaf.CheckSignatureFrom(ca) != nil {
		return true
	}
	for _, h := range m.Hosts {
		if leaf.VerifyHostname(h) != nil {
			return true
		}
	}
	return false
}

// renew fills sec: a new CA when the current one is missing or expiring
// (keeping the old one in the bundle while it is valid), and a new serving
// certificate from the current CA.
func (m *SelfManaged) renew(sec *corev1.Secret, now time.Time) error {
	ca, caKey, err := parseCA(sec.Data[SecretCACert], sec.Data[SecretCAKey])
	bundle := sec.Data[SecretCACert]
	if err != nil || now.Add(CARenewBefore).After(ca.NotAfter) {
		var caPEM, keyPEM []byte
		if ca, caKey, caPEM, keyPEM, err = newCA(now); err != nil {
			return err
		}
		old := validCerts(bundle, now)
		bundle = append(caPEM, old...)
		sec.Data[SecretCAKey] = keyPEM
	}
	certPEM, keyPEM, err := newServing(ca, caKey, m.Hosts, now)
	if err != nil {
		return err
	}
	sec.Data[SecretCACert] = bundle
	sec.Data[corev1.TLSCertKey] = certPEM
	sec.Data[corev1.TLSPrivateKeyKey] = keyPEM
	return nil
}

// patchCABundle sets bundle on every webhook of the configuration whose
// caBundle differs. A missing configuration is not an error yet (the chart
// may not have created it); it is retried next pass.
func (m *SelfManaged) patchCABundle(ctx context.Context, bundle []byte) error {
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := m.Client.Get(ctx, client.ObjectKey{Name: m.Configuration}, cfg); err != nil {
		if apierrors.IsNotFound(err) {
			m.Log.Info("MutatingWebhookConfiguration not found; its caBundle will be set once it exists", "configuration", m.Configuration)
			return nil
		}
		return fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", m.Configuration, err)
	}
	orig := cfg.DeepCopy()
	changed := false
	for i := range cfg.Webhooks {
		if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, bundle) {
			cfg.Webhooks[i].ClientConfig.CABundle = bundle
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := m.Client.Patch(ctx, cfg, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("patching the caBundle of MutatingWebhookConfiguration %s: %w", m.Configuration, err)
	}
	m.Log.Info("patched the webhook caBundle", "configuration", m.Configuration)
	return nil
}

func parseCert(p []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(p)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

func parseCA(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	ca, err := parseCert(certPEM)
	if err != nil {
		return nil, nil, err
	}
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return nil, nil, errors.New("no PEM CA key")
	}
	k, err := x509.ParseECPrivateKey(b.Bytes)
	if err != nil {
		return nil, nil, err
	}
	if !k.PublicKey.Equal(ca.PublicKey) {
		return nil, nil, errors.New("CA key does not match the first certificate of the bundle")
	}
	return ca, k, nil
}

// validCerts returns the PEM certificates in bundle still valid at now.
func validCerts(bundle []byte, now time.Time) []byte {
	var out []byte
	for {
		var b *pem.Block
		b, bundle = pem.Decode(bundle)
		if b == nil {
			return out
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil && now.Before(c.NotAfter) {
			out = append(out, pem.EncodeToMemory(b)...)
		}
	}
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func newCA(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "proxyfleet webhook CA " + now.UTC().Format("2006-01-02")},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return ca, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), nil
}

func newServing(ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string, now time.Time) ([]byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(ServingValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), nil
}

// DirCerts serves tls.crt and tls.key from a directory another party keeps
// current (cert-manager's Secret mounted into the pod; its CA injector keeps
// the caBundle), reloading them when they change.
type DirCerts struct {
	w     *certwatcher.CertWatcher
	ready chan struct{}
}

// NewDirCerts loads dir/tls.crt and dir/tls.key now, naming what is wrong.
func NewDirCerts(dir string) (*DirCerts, error) {
	w, err := certwatcher.New(dir+"/"+corev1.TLSCertKey, dir+"/"+corev1.TLSPrivateKeyKey)
	if err != nil {
		return nil, fmt.Errorf("--webhook-cert-dir %s: %w", dir, err)
	}
	r := make(chan struct{})
	close(r)
	return &DirCerts{w: w, ready: r}, nil
}

// GetCertificate is the TLS server's certificate callback.
func (d *DirCerts) GetCertificate(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
	return d.w.GetCertificate(h)
}

// Ready is closed: the certificate was loaded by NewDirCerts.
func (d *DirCerts) Ready() <-chan struct{} { return d.ready }

// NeedLeaderElection is false: every replica serves.
func (d *DirCerts) NeedLeaderElection() bool { return false }

// Start watches the files until ctx ends.
func (d *DirCerts) Start(ctx context.Context) error { return d.w.Start(ctx) }
