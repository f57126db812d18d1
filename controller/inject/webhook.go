package inject

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/proxyfleet/proxyfleet/internal/httpserver"
)

// Path is where the webhook answers; the MutatingWebhookConfiguration's
// clientConfig names it.
const Path = "/inject"

// Handler is the admission handler: it decides, mutates and answers with a
// JSON patch, or denies a pod whose annotations are bad.
type Handler struct {
	// Config is the injection's settings.
	Config Config
	// Namespaces reads the pod's namespace for its label; a direct reader
	// (the manager's APIReader), so the controller keeps no namespace cache.
	Namespaces client.Reader
	// Decoder decodes the pod; admission.NewDecoder over the manager's scheme.
	Decoder admission.Decoder
	// Log gets one line per injected or rejected pod.
	Log logr.Logger
}

// Handle answers one admission request.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.Kind.Kind != "Pod" || req.SubResource != "" {
		return admission.Allowed("only pod creation is injected")
	}
	pod := &corev1.Pod{}
	if err := h.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the pod: %w", err))
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	ns := &corev1.Namespace{}
	if err := h.Namespaces.Get(ctx, client.ObjectKey{Name: pod.Namespace}, ns); err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading namespace %s for its %s label: %w", pod.Namespace, LabelInject, err))
	}
	want, why, refuse := h.Config.Wanted(pod, ns.Labels)
	if refuse {
		h.Log.Info("pod rejected: it asked for the sidecar and cannot have it", "namespace", pod.Namespace, "pod", podName(pod), "why", why)
		return admission.Denied(why)
	}
	if !want {
		return admission.Allowed("not injected: " + why)
	}
	// Both sides go through the same typed encoding, so the patch holds
	// only what Mutate changed.
	before, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if err := h.Config.Mutate(pod); err != nil {
		var ae *AnnotationError
		if errors.As(err, &ae) {
			h.Log.Info("pod rejected: bad injection annotation", "namespace", pod.Namespace, "pod", podName(pod), "annotation", ae.Annotation)
			return admission.Denied(err.Error())
		}
		var pe *PortClashError
		if errors.As(err, &pe) {
			h.Log.Info("pod rejected: a container declares a sidecar port", "namespace", pod.Namespace, "pod", podName(pod), "container", pe.Container, "port", pe.Port)
			return admission.Denied(err.Error())
		}
		return admission.Errored(http.StatusInternalServerError, err)
	}
	after, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	h.Log.Info("injected the gateway sidecar", "namespace", pod.Namespace, "pod", podName(pod))
	return admission.PatchResponseFromRaw(before, after)
}

func podName(p *corev1.Pod) string {
	if p.Name != "" {
		return p.Name
	}
	return p.GenerateName + "*"
}

// Server serves the webhook over TLS on a listener opened by NewServer (so
// a busy port fails the controller's start, and tests can listen on :0),
// with certificates from Certs. It is a manager Runnable on every replica.
type Server struct {
	ln    net.Listener
	srv   *http.Server
	certs CertSource
	log   logr.Logger
}

// CertSource hands the serving certificate to each TLS handshake and says
// when the first one is there.
type CertSource interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Ready is closed once a certificate is available.
	Ready() <-chan struct{}
}

// NewServer opens listen and returns the webhook server for h.
func NewServer(listen string, h *Handler, scheme *runtime.Scheme, certs CertSource, log logr.Logger) (*Server, error) {
	if h.Decoder == nil {
		h.Decoder = admission.NewDecoder(scheme)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("sidecar injection webhook: cannot listen on %s: %w", listen, err)
	}
	wh := &admission.Webhook{Handler: h}
	mux := http.NewServeMux()
	mux.Handle(Path, wh)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	srv := httpserver.New(mux, slog.New(logr.ToSlogHandler(log)), httpserver.Timeouts{})
	srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate}
	return &Server{
		ln:    ln,
		certs: certs,
		log:   log,
		srv:   srv,
	}, nil
}

// Addr is the listener's address (the port chosen for ":0").
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// NeedLeaderElection is false: every replica answers the API server.
func (s *Server) NeedLeaderElection() bool { return false }

// Start serves once a certificate is there, until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	select {
	case <-s.certs.Ready():
	case <-ctx.Done():
		_ = s.ln.Close()
		return nil
	}
	s.log.Info("sidecar injection webhook serving", "addr", s.ln.Addr().String(), "path", Path)
	served := make(chan error, 1)
	go func() { served <- s.srv.ServeTLS(s.ln, "", "") }()
	select {
	case err := <-served:
		return fmt.Errorf("sidecar injection webhook on %s: %w", s.ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil {
		_ = s.srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
