package main

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/gateway"
	"github.com/proxyfleet/proxyfleet/gateway/mirror"
	"github.com/proxyfleet/proxyfleet/gateway/mitmca"
	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Flags of `proxyfleet mitm-ca init`.
const (
	flagCACert       = "cert"
	flagCAKey        = "key"
	flagCACommonName = "common-name"
	flagCAValidity   = "validity"
	flagCAForce      = "force"
)

// mitmCACommand is `proxyfleet mitm-ca`: the CA the gateway signs MITM
// leaves with. Only flags and file handling live here.
func mitmCACommand() *cli.Command {
	return &cli.Command{
		Name:  "mitm-ca",
		Usage: "manage the CA the gateway's MITM mode signs per-host certificates with",
		Subcommands: []*cli.Command{{
			Name:         "init",
			OnUsageError: usageError("mitm-ca init"),
			Usage:        "write a new CA certificate and key for --mitm-ca-cert and --mitm-ca-key",
			Description: "Writes an ECDSA P-256 CA (key usage certificate and CRL signing and digital signature; path length 0). The key file is\n" +
				"created 0600; existing files are kept unless --force. Crawlers trust the certificate;\n" +
				"the key stays with the gateway (see docs/mitm.md).",
			Flags: []cli.Flag{
				&cli.PathFlag{Name: flagCACert, Usage: "`FILE` to write the CA certificate (PEM) to", Required: true, TakesFile: true},
				&cli.PathFlag{Name: flagCAKey, Usage: "`FILE` to write the CA private key (PEM, PKCS #8) to", Required: true, TakesFile: true},
				&cli.StringFlag{Name: flagCACommonName, Value: defaultCACommonName(), Usage: "the CA's subject common name, as trust stores show it"},
				&cli.DurationFlag{Name: flagCAValidity, Value: mitmca.DefaultCAValidity, DefaultText: "87600h (10 years)", Usage: "how long the CA is valid"},
				&cli.BoolFlag{Name: flagCAForce, Usage: "overwrite existing files"},
			},
			Action: func(c *cli.Context) error {
				if c.Args().Present() {
					return fmt.Errorf("mitm-ca init takes no arguments, got %q", c.Args().First())
				}
				certPath, keyPath := c.Path(flagCACert), c.Path(flagCAKey)
				if certPath == keyPath {
					return fmt.Errorf("--%s and --%s name the same file", flagCACert, flagCAKey)
				}
				// Both directories before either file: a key written
				// beside a certificate that cannot be would block the
				// next try with "exists".
				for _, f := range []struct{ flag, path string }{{flagCAKey, keyPath}, {flagCACert, certPath}} {
					if dir := filepath.Dir(f.path); !isDir(dir) {
						return fmt.Errorf("--%s %s: the directory %s does not exist; create it first (mkdir -p %s)", f.flag, f.path, dir, dir)
					}
				}
				if v := c.Duration(flagCAValidity); v <= 0 {
					return fmt.Errorf("--%s %s: must be positive", flagCAValidity, v)
				}
				certPEM, keyPEM, err := mitmca.Generate(c.String(flagCACommonName), c.Duration(flagCAValidity), time.Now())
				if err != nil {
					return err
				}
				// The key first: a certificate without its key is useless.
				if err := writeNew(flagCAKey, keyPath, keyPEM, 0o600, c.Bool(flagCAForce)); err != nil {
					return err
				}
				if err := writeNew(flagCACert, certPath, certPEM, 0o644, c.Bool(flagCAForce)); err != nil {
					return err
				}
				spki, _ := caSPKIHash(certPEM)
				fmt.Fprintf(c.App.Writer, "wrote the CA certificate to %s and its key to %s (mode 0600)\n", certPath, keyPath)
				fmt.Fprintf(c.App.Writer, "  proxyfleet gateway --mitm-ca-cert %s --mitm-ca-key %s\n", certPath, keyPath)
				fmt.Fprintf(c.App.Writer, "  crawlers trust %s: curl --cacert, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS (docs/mitm.md)\n", certPath)
				fmt.Fprintf(c.App.Writer, "  chromium --ignore-certificate-errors-spki-list=%s\n", spki)
				return nil
			},
		}},
	}
}

func defaultCACommonName() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "proxyfleet MITM CA"
	}
	return "proxyfleet MITM CA (" + h + ")"
}

// isDir reports whether path is a directory.
func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// writeNew writes data to path with mode, refusing to replace a file unless force.
func writeNew(flagName, path string, data []byte, mode os.FileMode, force bool) error {
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, mode)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("--%s %s exists; pass --%s to replace it", flagName, path, flagCAForce)
	}
	if err != nil {
		return fmt.Errorf("--%s: %w", flagName, err)
	}
	if force {
		// O_TRUNC keeps an existing file's mode; the key must not stay readable.
		if err := f.Chmod(mode); err != nil {
			_ = f.Close()
			return fmt.Errorf("--%s: %w", flagName, err)
		}
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("--%s: %w", flagName, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--%s: %w", flagName, err)
	}
	return nil
}

// caSPKIHash is the base64 SHA-256 of the certificate's public key, the
// form Chromium's --ignore-certificate-errors-spki-list takes.
func caSPKIHash(certPEM []byte) (string, error) {
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return "", errors.New("no PEM certificate")
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:]), nil
}

// mitmFrom reads --mitm-ca-cert, --mitm-ca-key, --mitm-bypass,
// --mitm-fingerprint and --mitm-fallback-preset; nil options when MITM is off.
func mitmFrom(c *cli.Context) (*gateway.MITMOptions, error) {
	certPath, keyPath := c.Path(flagMITMCACert), c.Path(flagMITMCAKey)
	bypass := c.StringSlice(flagMITMBypass)
	switch {
	case certPath == "" && keyPath == "":
		// A MITM setting without MITM is a mistake to say, not to ignore:
		// its value would not even be checked.
		for _, f := range []string{flagMITMBypass, flagMITMFingerprint, flagMITMFallbackPreset} {
			if c.IsSet(f) {
				return nil, fmt.Errorf("--%s without --%s and --%s: MITM is off", f, flagMITMCACert, flagMITMCAKey)
			}
		}
		return nil, nil
	case certPath == "" || keyPath == "":
		return nil, fmt.Errorf("--%s and --%s go together (MITM needs both)", flagMITMCACert, flagMITMCAKey)
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagMITMCACert, err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagMITMCAKey, err)
	}
	ca, err := mitmca.Load(certPEM, keyPEM, 0)
	if err != nil {
		// LoadCA's messages never quote the key.
		return nil, fmt.Errorf("--%s %s / --%s %s: %w", flagMITMCACert, certPath, flagMITMCAKey, keyPath, err)
	}
	hp, err := sites.ParseHosts(bypass)
	if err != nil {
		ca.Close()
		return nil, fmt.Errorf("--%s: %w", flagMITMBypass, err)
	}
	fp, err := gateway.ParseFingerprint(c.String(flagMITMFingerprint))
	if err != nil {
		ca.Close()
		return nil, fmt.Errorf("--%s: %w", flagMITMFingerprint, err)
	}
	preset := c.String(flagMITMFallbackPreset)
	if _, err := mirror.PresetByName(preset); err != nil {
		ca.Close()
		return nil, fmt.Errorf("--%s: %w", flagMITMFallbackPreset, err)
	}
	return &gateway.MITMOptions{CA: ca, Bypass: hp, Fingerprint: fp, FallbackPreset: preset}, nil
}

// siteRootsFrom is the system roots plus --upstream-ca-file, nil (the
// system roots) without it.
func siteRootsFrom(c *cli.Context) (*x509.CertPool, error) {
	path := c.Path(flagUpstreamCAFile)
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagUpstreamCAFile, err)
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if !roots.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("--%s %s holds no PEM certificate", flagUpstreamCAFile, path)
	}
	return roots, nil
}

// banRulesFrom reads --ban-rule. The flag library splits command-line and
// environment values on commas, which rules use inside status lists and
// regular expressions; every rule starts with a field name, so a piece
// that does not is glued back to the one before it.
func banRulesFrom(c *cli.Context) (rotation.BanRules, error) {
	var texts []string
	for _, piece := range c.StringSlice(flagBanRule) {
		if len(texts) > 0 && !startsBanRule(piece) {
			texts[len(texts)-1] += "," + piece
			continue
		}
		texts = append(texts, piece)
	}
	rules, err := rotation.ParseBanRules(texts)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagBanRule, err)
	}
	return rules, nil
}

func startsBanRule(s string) bool {
	s = strings.TrimSpace(s)
	for _, p := range []string{"status=", "header:", "body~", "action=", "preset="} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
