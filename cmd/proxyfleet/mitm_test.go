package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// runMITMCAInit runs `proxyfleet mitm-ca init args...` in-process.
func runMITMCAInit(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := newApp()
	app.Writer, app.ErrWriter = &out, io.Discard
	err := app.Run(append([]string{"proxyfleet", "mitm-ca", "init"}, args...))
	return out.String(), err
}

func TestMITMCAInitWritesAPairTheGatewayLoads(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	out, err := runMITMCAInit(t, "--cert", cert, "--key", key, "--common-name", "test fleet CA")
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(key)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file %v mode %v, want 0600", err, st.Mode())
	}
	keyPEM, _ := os.ReadFile(key)
	if strings.Contains(out, strings.TrimSpace(string(keyPEM))) || strings.Contains(out, "PRIVATE KEY") {
		t.Fatal("mitm-ca init printed the key")
	}
	if !strings.Contains(out, "--ignore-certificate-errors-spki-list=") {
		t.Errorf("output %q does not say how to trust it in Chromium", out)
	}
	cfg, err := runConfig(t, "--mitm-ca-cert", cert, "--mitm-ca-key", key, "--mitm-bypass", "*.bank.example")
	if err != nil {
		t.Fatalf("the gateway refuses the pair init wrote: %v", err)
	}
	defer cfg.MITM.CA.Close()
	if cfg.MITM.CA.Certificate().Subject.CommonName != "test fleet CA" || !cfg.MITM.Bypass.Match("login.bank.example") {
		t.Fatalf("loaded %+v", cfg.MITM)
	}

	missing := filepath.Join(dir, "no", "such")
	if _, err := runMITMCAInit(t, "--cert", filepath.Join(missing, "ca.pem"), "--key", filepath.Join(dir, "k2.pem")); err == nil ||
		!strings.Contains(err.Error(), "--cert") || !strings.Contains(err.Error(), "mkdir -p "+missing) {
		t.Fatalf("init into a missing directory: %v, want an error naming --cert and the directory", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "k2.pem")); !os.IsNotExist(err) {
		t.Fatalf("the key was written although the certificate could not be: %v", err)
	}
	if _, err := runMITMCAInit(t, "--cert", cert, "--key", key); err == nil || !strings.Contains(err.Error(), "exists; pass --force") {
		t.Fatalf("init over existing files: %v, want a refusal naming --force", err)
	}
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runMITMCAInit(t, "--cert", cert, "--key", key, "--force"); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(key); st.Mode().Perm() != 0o600 {
		t.Fatalf("--force left the key file %v, want 0600", st.Mode())
	}
}

func TestMITMAndBanRuleFlagsRefuseBadInput(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if _, err := runMITMCAInit(t, "--cert", cert, "--key", key); err != nil {
		t.Fatal(err)
	}
	notPEM := writeFile(t, "junk.pem", "not a certificate\n")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"a cert without a key", []string{"--mitm-ca-cert", cert}, "--mitm-ca-cert and --mitm-ca-key go together"},
		{"a key that is not one", []string{"--mitm-ca-cert", cert, "--mitm-ca-key", notPEM}, "--mitm-ca-cert " + cert},
		{"the cert as key", []string{"--mitm-ca-cert", cert, "--mitm-ca-key", cert}, "no PEM PRIVATE KEY block"},
		{"bypass without MITM", []string{"--mitm-bypass", "example.com"}, "--mitm-bypass without --mitm-ca-cert"},
		{"a fingerprint without MITM (its value went unchecked)", []string{"--mitm-fingerprint", "bogus"}, "--mitm-fingerprint without --mitm-ca-cert"},
		{"a fallback preset without MITM", []string{"--mitm-fallback-preset", "bogus"}, "--mitm-fallback-preset without --mitm-ca-cert"},
		{"a bypass with a port", []string{"--mitm-ca-cert", cert, "--mitm-ca-key", key, "--mitm-bypass", "example.com:443"}, "--mitm-bypass: host pattern"},
		{"an unknown fingerprint mode", []string{"--mitm-ca-cert", cert, "--mitm-ca-key", key, "--mitm-fingerprint", "chrome"}, `--mitm-fingerprint: fingerprint "chrome": want mirror or go`},
		{"an unknown fallback preset", []string{"--mitm-ca-cert", cert, "--mitm-ca-key", key, "--mitm-fallback-preset", "netscape"}, `--mitm-fallback-preset: unknown ClientHello preset "netscape"`},
		{"a malformed rule names it", []string{"--ban-rule", "status=200 body~( action=banned"}, `--ban-rule: ban rule "status=200 body~( action=banned"`},
		{"an unknown preset", []string{"--ban-rule", "preset=akamai"}, "unknown preset"},
		{"ban-body-bytes zero", []string{"--ban-body-bytes", "0"}, "--ban-body-bytes 0"},
		{"an upstream CA file without certificates", []string{"--upstream-ca-file", notPEM}, "--upstream-ca-file " + notPEM + " holds no PEM certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runConfig(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY-----") {
				t.Fatal("an error quotes the key")
			}
		})
	}
}

func TestBanRulesSurviveTheFlagLibrarysCommaSplitting(t *testing.T) {
	t.Setenv("PROXYFLEET_BAN_RULE", "status=403,503 header:cf-mitigated~^challenge$ action=banned,preset=empty-200")
	cfg, err := runConfig(t, "--ban-rule", "status=200 body~a{1,3}z action=rate_limited")
	if err != nil {
		t.Fatal(err)
	}
	rs := cfg.Classifier.Rules
	if len(rs) != 1 || rs[0].Text != "status=200 body~a{1,3}z action=rate_limited" {
		t.Fatalf("the flag's rule parsed as %+v", rs)
	}
	cfg, err = runConfig(t)
	if err != nil {
		t.Fatal(err)
	}
	rs = cfg.Classifier.Rules
	if len(rs) != 2 || len(rs[0].Statuses) != 2 || rs[1].Action != rotation.ResultBanned {
		t.Fatalf("the environment's two rules parsed as %+v", rs)
	}
	yaml := writeFile(t, "c.yaml", "ban-rule:\n  - status=403,503 action=banned\n  - preset=captcha\nban-body-bytes: 1024\n")
	if cfg, err = runConfig(t, "--config", yaml); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Classifier.Rules) != 2 || cfg.BanBodyBytes != 1024 {
		t.Fatalf("the YAML list parsed as %d rules, %d body bytes", len(cfg.Classifier.Rules), cfg.BanBodyBytes)
	}
}
