package manager

import (
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller/inject"
)

// setupWebhook adds the injection webhook to mgr unless it is off.
func (r *run) setupWebhook(mgr ctrl.Manager) error {
	o, n := r.cfg.Webhook, r.cfg.Names
	if o.Listen == "" {
		r.log.Info("sidecar injection off (" + or(n.WebhookListen, "Webhook.Listen") + " 0 or no " + or(n.GatewayImage, "Webhook.Config.Image") + ")")
		return nil
	}
	o.Log = r.log
	srv, err := inject.Setup(mgr, o)
	if err != nil {
		return err
	}
	certs := "self-managed in " + o.CertSecret.String()
	if o.CertDir != "" {
		certs = or(n.WebhookCertDir, "Webhook.CertDir")
	}
	r.log.Info("sidecar injection on", "addr", srv.Addr().String(), "image", o.Config.Image, "poolAPI", o.Config.PoolAPI, "certs", certs)
	return nil
}
