package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// hashInput is what an instance is built from. Fields that do not change the
// instance (attributes, health check) stay out, so editing them never
// replaces a proxy. The cloud-init content is in, whichever way it was given,
// so rotating a referenced Secret replaces the instance.
type hashInput struct {
	Provider    string `json:"provider"`
	Zone        string `json:"zone,omitempty"`
	MachineType string `json:"machineType,omitempty"`
	Image       string `json:"image,omitempty"`
	Port        int32  `json:"port"`
	CloudInit   string `json:"cloudInit,omitempty"`
	// Login is a fingerprint of the generated proxy login, never the login.
	Login string `json:"login,omitempty"`
}

// specHash returns the hex SHA-256 of the instance-shaping spec fields plus
// the resolved cloud-init content and the fingerprint of the generated login
// (empty for instances without one); it is stored in the spec-hash annotation.
func specHash(p *v1alpha1.Proxy, cloudInit []byte, login string) string {
	in := hashInput{Provider: p.Spec.Provider, Port: p.EffectivePort(), CloudInit: string(cloudInit), Login: login}
	if pl := p.Spec.Placement; pl != nil {
		in.Zone, in.MachineType, in.Image = pl.Zone, pl.MachineType, pl.Image
	}
	b, err := json.Marshal(in)
	if err != nil {
		// A struct of strings and an int always marshals.
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// setSpecHash records the hash the current instance was built from.
func setSpecHash(p *v1alpha1.Proxy, hash string) {
	ann := p.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[v1alpha1.AnnotationSpecHash] = hash
	p.SetAnnotations(ann)
}
