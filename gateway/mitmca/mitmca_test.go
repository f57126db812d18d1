package mitmca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"
)

func TestGeneratedCAIsASigningOnlyCA(t *testing.T) {
	certPEM, keyPEM, err := Generate("proxyfleet MITM CA (test)", DefaultCAValidity, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !cert.IsCA || !cert.MaxPathLenZero || cert.KeyUsage&x509.KeyUsageCertSign == 0 || len(cert.ExtKeyUsage) != 0 {
		t.Errorf("CA %+v: want a CA with path length 0 that may sign certificates", cert)
	}
	if cert.Subject.CommonName != "proxyfleet MITM CA (test)" || time.Until(cert.NotAfter) < 9*365*24*time.Hour {
		t.Errorf("subject %q, valid until %v", cert.Subject.CommonName, cert.NotAfter)
	}
	if kb, _ := pem.Decode(keyPEM); kb == nil || kb.Type != "PRIVATE KEY" {
		t.Errorf("key PEM block %v, want PKCS #8", kb)
	}
	if _, err := Load(certPEM, keyPEM, 0); err != nil {
		t.Fatalf("the generated pair does not load: %v", err)
	}
}

func TestLoadCARefusesWhatCannotSignLeaves(t *testing.T) {
	certPEM, keyPEM, err := Generate("ca", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := Generate("other", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	expiredCert, expiredKey, err := Generate("old", time.Hour, time.Now().Add(-3*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	leafCert, leafKey := selfSignedLeaf(t)
	tests := []struct {
		name      string
		cert, key []byte
		want      string
	}{
		{"no certificate", []byte("junk"), keyPEM, "no PEM CERTIFICATE block"},
		{"no key", certPEM, []byte("junk"), "no PEM PRIVATE KEY block"},
		{"a key of another CA", certPEM, otherKey, "does not belong to the certificate"},
		{"an expired CA", expiredCert, expiredKey, "is not valid now"},
		{"a certificate that is not a CA", leafCert, leafKey, "is not a CA"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.cert, tc.key, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadCA = %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY-----") {
				t.Fatal("the error quotes the key")
			}
		})
	}
}

func selfSignedLeaf(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "leaf"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func TestLeavesNameTheirHostAndChainToTheCA(t *testing.T) {
	ca, roots := newTestCA(t)
	tests := []struct {
		name, host string
		dns, ip    bool
	}{
		{"a name gets a DNS SAN", "Shop.Example.COM.", true, false},
		{"an IPv4 literal gets an IP SAN", "127.0.0.9", false, true},
		{"an IPv6 literal gets an IP SAN", "::1", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ca.LeafFor(tc.host)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Certificate) != 2 {
				t.Fatalf("chain of %d certificates, want the leaf and the CA", len(c.Certificate))
			}
			leaf := c.Leaf
			if (len(leaf.DNSNames) > 0) != tc.dns || (len(leaf.IPAddresses) > 0) != tc.ip {
				t.Fatalf("SANs %v %v", leaf.DNSNames, leaf.IPAddresses)
			}
			if leaf.NotAfter.Sub(leaf.NotBefore) > 26*time.Hour || leaf.IsCA {
				t.Fatalf("leaf valid %v..%v, CA %v: want short-lived, not a CA", leaf.NotBefore, leaf.NotAfter, leaf.IsCA)
			}
			host := strings.ToLower(strings.TrimSuffix(tc.host, "."))
			if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err != nil {
				t.Fatalf("the leaf does not verify for %s under the CA: %v", host, err)
			}
			again, _ := ca.LeafFor(tc.host)
			if again != c {
				t.Fatal("a second request minted again instead of using the cache")
			}
		})
	}
}

// newTestCA makes and loads a fresh CA, and a pool that trusts it.
func newTestCA(t *testing.T) (*CA, *x509.CertPool) {
	t.Helper()
	certPEM, keyPEM, err := Generate("proxyfleet test CA", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := Load(certPEM, keyPEM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ca.Close)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	return ca, roots
}

// TestAMissThatLostTheRaceToAFlightTakesItsLeaf: a LeafFor that missed the
// cache while another call was minting, and begins its own flight only
// after that one ended, takes the leaf the cache now holds instead of
// minting a second one.
func TestAMissThatLostTheRaceToAFlightTakesItsLeaf(t *testing.T) {
	ca, _ := newTestCA(t)
	first, err := ca.LeafFor("site.example")
	if err != nil {
		t.Fatal(err)
	}
	late, err := ca.leafMissed("site.example")
	if err != nil {
		t.Fatal(err)
	}
	if late != first {
		t.Fatalf("the late miss minted serial %v; want the cached leaf, serial %v", late.Leaf.SerialNumber, first.Leaf.SerialNumber)
	}
}
