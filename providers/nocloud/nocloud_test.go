package nocloud

import (
	"bytes"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"testing"
)

func TestSeedCarriesUserDataByteForByteUnderTheCidataLabel(t *testing.T) {
	tests := []struct {
		name   string
		seed   Seed
		vendor bool
	}{
		{"cloud-config with comments and odd scalars", Seed{InstanceID: "proxy-a", Hostname: "proxy-a",
			UserData: []byte("#cloud-config\n# keep me\nversion: 1.10\npackages: [squid]\n")}, false},
		{"a shell script and vendor-data", Seed{InstanceID: "proxy-b", Hostname: "proxy-b",
			UserData: []byte("#!/bin/sh\necho hi\n"), VendorData: []byte(GuestAgentScript)}, true},
		{"a jinja template", Seed{InstanceID: "proxy-c", Hostname: "c",
			UserData: []byte("## template: jinja\n#cloud-config\nhostname: {{ v1.local_hostname }}\n")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			iso, err := BuildISO(tt.seed)
			if err != nil {
				t.Fatal(err)
			}
			label, files, err := ReadISO(iso)
			if err != nil {
				t.Fatal(err)
			}
			if label != Label {
				t.Fatalf("label = %q, want %q", label, Label)
			}
			if !bytes.Equal(files["user-data"], tt.seed.UserData) {
				t.Fatalf("user-data = %q, want %q", files["user-data"], tt.seed.UserData)
			}
			if want := "instance-id: " + tt.seed.InstanceID + "\nlocal-hostname: " + tt.seed.Hostname + "\n"; string(files["meta-data"]) != want {
				t.Fatalf("meta-data = %q, want %q", files["meta-data"], want)
			}
			if _, ok := files["vendor-data"]; ok != tt.vendor {
				t.Fatalf("vendor-data present = %v, want %v (files %v)", ok, tt.vendor, len(files))
			}
		})
	}
}

func TestBuildISORefusesMetaDataInjection(t *testing.T) {
	if _, err := BuildISO(Seed{InstanceID: "x\nlocal-hostname: evil", Hostname: "h"}); err == nil {
		t.Fatal("an instance ID with a line break was accepted")
	}
	if _, err := BuildISO(Seed{Hostname: "h"}); err == nil {
		t.Fatal("an empty instance ID was accepted")
	}
}

func TestVendorDataCombinations(t *testing.T) {
	extra := []byte("#cloud-config\nntp: {enabled: true}\n")
	tests := []struct {
		name       string
		guestAgent bool
		extra      []byte
		wantParts  []string // content types; nil = not multipart
		want       []byte
	}{
		{"nothing", false, nil, nil, nil},
		{"guest agent only", true, nil, nil, []byte(GuestAgentScript)},
		{"extra only, untouched", false, extra, nil, extra},
		{"both as multipart", true, extra, []string{"text/x-shellscript", "text/plain"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := VendorData(tt.guestAgent, tt.extra)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantParts == nil {
				if !bytes.Equal(got, tt.want) {
					t.Fatalf("vendor-data = %q, want %q", got, tt.want)
				}
				return
			}
			msg, err := mail.ReadMessage(bytes.NewReader(got))
			if err != nil {
				t.Fatal(err)
			}
			mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
			if err != nil || mt != "multipart/mixed" {
				t.Fatalf("content type %q (%v), want multipart/mixed", mt, err)
			}
			r := multipart.NewReader(msg.Body, params["boundary"])
			var types []string
			var bodies [][]byte
			for {
				p, err := r.NextPart()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				ct, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
				types = append(types, ct)
				b, _ := io.ReadAll(p)
				bodies = append(bodies, b)
			}
			if len(types) != 2 || types[0] != tt.wantParts[0] || types[1] != tt.wantParts[1] {
				t.Fatalf("parts %v, want %v", types, tt.wantParts)
			}
			if string(bodies[0]) != GuestAgentScript || !bytes.Equal(bodies[1], extra) {
				t.Fatalf("part bodies changed: %q / %q", bodies[0], bodies[1])
			}
		})
	}
}
