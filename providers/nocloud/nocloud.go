// Package nocloud builds the NoCloud seed a VM provider attaches to a guest
// as a CD-ROM: an ISO 9660 image labelled "cidata" with the files cloud-init
// reads on first boot (user-data, meta-data, and optionally vendor-data).
// The user-data is written byte for byte as the Proxy gave it, in whatever
// format; what the provider adds of its own travels as vendor-data, which
// cloud-init runs through its own handlers and never merges into the
// user's document.
//
// It imports the ISO writer only, nothing of proxyfleet.
package nocloud

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/textproto"
	"strings"

	"github.com/kdomanski/iso9660"
)

// Label is the volume label cloud-init's NoCloud source looks for.
const Label = "cidata"

// Seed is the content of one guest's seed.
type Seed struct {
	// InstanceID changes when the guest must be treated as a new instance;
	// the providers use the instance name.
	InstanceID string
	// Hostname becomes local-hostname.
	Hostname string
	// UserData is the Proxy's cloud-init (or the provider's bootstrap), as is.
	UserData []byte
	// VendorData is optional; see VendorData.
	VendorData []byte
}

// MetaData renders meta-data: instance-id and local-hostname.
func (s Seed) MetaData() []byte {
	return []byte("instance-id: " + s.InstanceID + "\nlocal-hostname: " + s.Hostname + "\n")
}

// BuildISO renders the seed image. The iso9660 writer stages files in the
// process's temp directory, so that directory must be writable (the
// controller's Pod mounts an emptyDir there).
func BuildISO(s Seed) ([]byte, error) {
	if s.InstanceID == "" || strings.ContainsAny(s.InstanceID, "\n\r") || strings.ContainsAny(s.Hostname, "\n\r") {
		return nil, errors.New("nocloud: the instance ID is required and neither it nor the hostname may contain line breaks")
	}
	w, err := iso9660.NewWriter()
	if err != nil {
		return nil, fmt.Errorf("nocloud: creating the ISO writer: %w", err)
	}
	defer func() { _ = w.Cleanup() }()
	files := map[string][]byte{"user-data": s.UserData, "meta-data": s.MetaData()}
	if len(s.VendorData) > 0 {
		files["vendor-data"] = s.VendorData
	}
	for name, body := range files {
		if err := w.AddFile(bytes.NewReader(body), name); err != nil {
			return nil, fmt.Errorf("nocloud: adding %s: %w", name, err)
		}
	}
	var buf bytes.Buffer
	if err := w.WriteTo(&buf, Label); err != nil {
		return nil, fmt.Errorf("nocloud: writing the ISO: %w", err)
	}
	return buf.Bytes(), nil
}

// ReadISO parses a seed image back into its label and files. Providers use
// it nowhere on the hot path; it exists so tests and operators can check
// what a guest was given.
func ReadISO(data []byte) (label string, files map[string][]byte, err error) {
	img, err := iso9660.OpenImage(bytes.NewReader(data))
	if err != nil {
		return "", nil, err
	}
	label, err = img.Label()
	if err != nil {
		return "", nil, err
	}
	root, err := img.RootDir()
	if err != nil {
		return "", nil, err
	}
	children, err := root.GetChildren()
	if err != nil {
		return "", nil, err
	}
	files = map[string][]byte{}
	for _, c := range children {
		if c.IsDir() {
			continue
		}
		b, err := io.ReadAll(c.Reader())
		if err != nil {
			return "", nil, err
		}
		files[c.Name()] = b
	}
	return label, files, nil
}

// GuestAgentScript is the vendor-data shell script that installs and starts
// qemu-guest-agent with whichever package manager the image has. As a
// script it runs from cloud-init's scripts-vendor stage, after the user's
// packages and before the user's runcmd, and no cloud-config merge can drop it.
const GuestAgentScript = `#!/bin/sh
# proxyfleet: the guest agent lets the host read this VM's address.
if ! command -v qemu-ga >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-guest-agent
  elif command -v dnf >/dev/null 2>&1; then dnf install -y qemu-guest-agent
  elif command -v yum >/dev/null 2>&1; then yum install -y qemu-guest-agent
  elif command -v zypper >/dev/null 2>&1; then zypper --non-interactive install qemu-guest-agent
  elif command -v apk >/dev/null 2>&1; then apk add qemu-guest-agent
  fi
fi
systemctl enable --now qemu-guest-agent 2>/dev/null || service qemu-guest-agent start 2>/dev/null || true
`

// multipartBoundary is fixed so a seed's bytes depend only on its inputs;
// VendorData checks that neither part contains it.
const multipartBoundary = "proxyfleet-vendor-data-7f3c9a51"

// VendorData returns the vendor-data for a guest: the guest-agent script
// when guestAgent is true, extra (the entry's configured vendor-data) when
// set, and a MIME multipart of both when both are. extra is declared
// text/plain, so cloud-init sniffs its real type itself and this code never
// has to classify user content. Nil means no vendor-data file.
func VendorData(guestAgent bool, extra []byte) ([]byte, error) {
	switch {
	case !guestAgent && len(extra) == 0:
		return nil, nil
	case !guestAgent:
		return extra, nil
	case len(extra) == 0:
		return []byte(GuestAgentScript), nil
	}
	if bytes.Contains(extra, []byte(multipartBoundary)) {
		return nil, errors.New("nocloud: the vendor-data contains the multipart boundary")
	}
	var buf bytes.Buffer
	buf.WriteString("Content-Type: multipart/mixed; boundary=\"" + multipartBoundary + "\"\nMIME-Version: 1.0\n\n")
	mw := multipart.NewWriter(&buf)
	if err := mw.SetBoundary(multipartBoundary); err != nil {
		return nil, err
	}
	parts := []struct {
		ctype, name string
		body        []byte
	}{
		{"text/x-shellscript", "proxyfleet-guest-agent.sh", []byte(GuestAgentScript)},
		{"text/plain", "vendor-data", extra},
	}
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		h.Set("Content-Type", p.ctype+"; charset=\"utf-8\"")
		h.Set("Content-Disposition", "attachment; filename=\""+p.name+"\"")
		pw, err := mw.CreatePart(h)
		if err != nil {
			return nil, err
		}
		if _, err := pw.Write(p.body); err != nil {
			return nil, err
		}
	}
	if err := mw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
