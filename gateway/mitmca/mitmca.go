// Package mitmca is the gateway's MITM certificate authority: it makes a
// CA (Generate), loads one from PEM and checks it can sign (Load), and
// mints a short-lived leaf per host on demand, cached and minted once under
// concurrency (CA.LeafFor). It knows nothing of requests or members, and
// imports nothing of proxyfleet's but gateway/internal/echo.
package mitmca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
)

const (
	// DefaultCAValidity is how long `proxyfleet mitm-ca init` makes a CA
	// valid: long enough that crawlers' trust stores need no yearly roll.
	DefaultCAValidity = 10 * 365 * 24 * time.Hour
	// leafValidity is a minted leaf's lifetime: short, so a leaked leaf is
	// worth little; the cache drops a leaf well before it ends.
	leafValidity = 24 * time.Hour
	// leafBackdate covers clients whose clock runs a little behind.
	leafBackdate = time.Hour
	// leafCacheTTL is how long a minted leaf is served from the cache.
	leafCacheTTL = 12 * time.Hour
	// leafMinRemaining: a cached leaf closer than this to its end is minted anew.
	leafMinRemaining = time.Minute
	// DefaultLeafCacheBytes bounds the leaf cache by the certificates'
	// encoded size (about 1 KiB each with the CA's chain: some 16,000 hosts).
	DefaultLeafCacheBytes = 32 << 20
)

// Generate makes a new MITM CA: an ECDSA P-256 key and a self-signed
// certificate for signing leaf certificates only (basic constraints CA with
// path length 0; key usage certificate and CRL signing). It returns both
// PEM-encoded; the key as PKCS #8. commonName names it in trust stores.
func Generate(commonName string, validity time.Duration, now time.Time) (certPEM, keyPEM []byte, err error) {
	if commonName == "" {
		return nil, nil, errors.New("mitm CA: empty common name")
	}
	if validity <= 0 {
		return nil, nil, errors.New("mitm CA: validity must be positive")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"proxyfleet MITM"}},
		NotBefore:             now.Add(-leafBackdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// CA signs the per-host leaf certificates the gateway shows a crawler in
// MITM mode. Load it with LoadCA. Its key is never logged or written.
type CA struct {
	cert *x509.Certificate
	der  []byte
	key  crypto.Signer
	// leafKey is the one key every leaf certifies: generating a key per
	// host would cost more than the signature, and it never leaves the
	// process (mitmproxy does the same).
	leafKey *ecdsa.PrivateKey

	cache   *leafCache
	flights certFlights
	// minted counts leaves signed, for tests and the debug log.
	minted atomic.Int64
	now    func() time.Time
}

// Load reads a CA certificate and its private key (PEM; PKCS #8, PKCS #1
// or SEC 1 for the key) and checks that they belong together and that the
// certificate may sign certificates and is valid now. cacheBytes bounds the
// leaf cache (DefaultLeafCacheBytes when 0). Errors never quote the key.
func Load(certPEM, keyPEM []byte, cacheBytes int64) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("mitm CA certificate: no PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, errors.New("mitm CA certificate: " + err.Error())
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, errors.New("mitm CA certificate " + echo.Quote(cert.Subject.CommonName) + " is not a CA (basic constraints)")
	}
	if cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("mitm CA certificate " + echo.Quote(cert.Subject.CommonName) + " may not sign certificates (key usage)")
	}
	now := time.Now()
	if now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return nil, errors.New("mitm CA certificate " + echo.Quote(cert.Subject.CommonName) + " is not valid now (" +
			cert.NotBefore.UTC().Format(time.RFC3339) + " to " + cert.NotAfter.UTC().Format(time.RFC3339) + ")")
	}
	key, err := parseSigner(keyPEM)
	if err != nil {
		return nil, err
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, errors.New("mitm CA key does not belong to the certificate " + echo.Quote(cert.Subject.CommonName))
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if cacheBytes == 0 {
		cacheBytes = DefaultLeafCacheBytes
	}
	if cacheBytes < 0 {
		return nil, errors.New("mitm CA: negative leaf cache size")
	}
	return &CA{cert: cert, der: cb.Bytes, key: key, leafKey: leafKey, cache: newLeafCache(cacheBytes), now: time.Now}, nil
}

// parseSigner reads a PEM private key of any common form.
func parseSigner(keyPEM []byte) (crypto.Signer, error) {
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || !strings.HasSuffix(kb.Type, "PRIVATE KEY") {
		return nil, errors.New("mitm CA key: no PEM PRIVATE KEY block")
	}
	if k, err := x509.ParsePKCS8PrivateKey(kb.Bytes); err == nil {
		if s, ok := k.(crypto.Signer); ok {
			return s, nil
		}
		return nil, errors.New("mitm CA key: not a signing key")
	}
	if k, err := x509.ParseECPrivateKey(kb.Bytes); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PrivateKey(kb.Bytes); err == nil {
		return k, nil
	}
	return nil, errors.New("mitm CA key: not a PKCS #8, SEC 1 or PKCS #1 private key")
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	switch k := a.(type) {
	case *ecdsa.PublicKey:
		return k.Equal(b)
	case *rsa.PublicKey:
		return k.Equal(b)
	case ed25519.PublicKey:
		return k.Equal(b)
	}
	return false
}

// Certificate is the CA's own certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Minted is how many leaf certificates this CA has signed.
func (ca *CA) Minted() int64 { return ca.minted.Load() }

// Close drops the cached leaves; the CA still mints after it.
func (ca *CA) Close() { ca.cache.clear() }

// LeafFor returns the leaf certificate for host (a name or an IP literal),
// from the cache or minted now. Concurrent first requests for one host wait
// for a single signature instead of each minting one.
func (ca *CA) LeafFor(host string) (*tls.Certificate, error) {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if c, ok := ca.cache.get(host, ca.now()); ok {
		return c, nil
	}
	return ca.leafMissed(host)
}

// leafMissed is LeafFor past a cache miss: one mint per host at a time,
// the others waiting for it. The one that mints asks the cache again
// first: a flight that ended between its miss and its begin has just
// filled it, and minting again (a second leaf, a second signature's CPU)
// is what a busy gateway did, 11 leaves for one host in a test.
func (ca *CA) leafMissed(host string) (*tls.Certificate, error) {
	f, leader := ca.flights.begin(host)
	if !leader {
		<-f.done
		return f.cert, f.err
	}
	if c, ok := ca.cache.get(host, ca.now()); ok {
		f.cert = c
		ca.flights.end(host, f)
		return c, nil
	}
	c, err := ca.mint(host)
	if err == nil {
		// Served for half its remaining life at most (a CA near its end
		// caps the leaves it signs), and never in its last minute.
		now := ca.now()
		ends := now.Add(min(leafCacheTTL, c.Leaf.NotAfter.Sub(now)/2))
		if last := c.Leaf.NotAfter.Add(-leafMinRemaining); last.Before(ends) {
			ends = last
		}
		ca.cache.set(host, c, certCost(c), ends)
	}
	f.cert, f.err = c, err
	ca.flights.end(host, f)
	return c, err
}

func certCost(c *tls.Certificate) int64 {
	n := int64(256) // the structs around the DER
	for _, d := range c.Certificate {
		n += int64(len(d))
	}
	return n
}

// mint signs a leaf for host: its name as the only SAN (an IP SAN for an
// IP literal), valid for a day, for server authentication. The chain sent
// to the client is the leaf and the CA.
func (ca *CA) mint(host string) (*tls.Certificate, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := ca.now()
	notAfter := now.Add(leafValidity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host, Organization: []string{"proxyfleet MITM"}},
		NotBefore:    now.Add(-leafBackdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, errors.New("mint a certificate for " + echo.Quote(host) + ": " + err.Error())
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca.minted.Add(1)
	return &tls.Certificate{Certificate: [][]byte{der, ca.der}, PrivateKey: ca.leafKey, Leaf: leaf}, nil
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// certFlights lets concurrent misses of one host share one mint.
type certFlights struct {
	mu sync.Mutex
	m  map[string]*certFlight
}

type certFlight struct {
	done chan struct{}
	cert *tls.Certificate
	err  error
}

func (fs *certFlights) begin(host string) (*certFlight, bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f, ok := fs.m[host]; ok {
		return f, false
	}
	if fs.m == nil {
		fs.m = make(map[string]*certFlight)
	}
	f := &certFlight{done: make(chan struct{})}
	fs.m[host] = f
	return f, true
}

func (fs *certFlights) end(host string, f *certFlight) {
	fs.mu.Lock()
	delete(fs.m, host)
	fs.mu.Unlock()
	close(f.done)
}
