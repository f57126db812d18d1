# The two commands the README promises: `make run` and `make test`.
SHELL := /usr/bin/env bash
GO ?= go
BIN := $(CURDIR)/bin
PROXYFLEET := $(BIN)/proxyfleet
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# envtest: the real kube-apiserver and etcd, built from e2e/tools into bin/k8s/.
ENVTEST_BIN_DIR := $(BIN)/k8s
CONTROLLER_TOOLS_VERSION := v0.23.0
CONTROLLER_GEN := $(BIN)/tools/controller-gen-$(CONTROLLER_TOOLS_VERSION)

# Every build but the race detector's (make unit) is static and -trimpath, as the images ship
# it: bin/proxyfleet is the controller image's binary, and vet, the e2e and cluster test binaries,
# fuzz and hack/image compile the same packages as make build, so Go's build cache holds one
# compile of each. Its key includes CGO_ENABLED and -trimpath: with make build's cgo build beside
# the image's static one, make test compiled the whole product twice (about 750 CPU seconds).
# Exported, so the scripts and the tests' own go builds see it too.
export CGO_ENABLED := 0
export GOFLAGS := $(strip $(filter-out -trimpath,$(GOFLAGS)) -trimpath)

.PHONY: node-bins squid-rootfs crawler-rootfs cluster-test cluster cluster-down guest-image all build sidecar image helm chart-lint run test deps fmt-check vet unit fuzz e2e bench clean envtest-bins generate verify-generated

all: build

## build: bin/proxyfleet, static (CGO_ENABLED=0, -trimpath, above), the binary make image ships.
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(PROXYFLEET) ./cmd/proxyfleet

## sidecar: the gateway without the controller (-tags sidecar), built as the sidecar image ships it
## (static, -trimpath, no symbol table or DWARF: -s -w), so make bench measures that binary. The
## same cmd/proxyfleet minus client-go, controller-runtime, gRPC and Redis (docs/injection.md).
## urfave_cli_no_docs leaves out the CLI library's man-page and Markdown writers (go-md2man,
## blackfriday: 0.26 MB) that nothing calls. Two of them: bin/proxyfleet-sidecar, also without
## MITM mirroring (nomirror: uTLS, circl, fhttp, 4.3 MB), what a pod without a MITM CA runs, and
## bin/proxyfleet-sidecar-mitm with it, what the webhook runs for proxyfleet.io/mitm pods.
SIDECAR_TAGS := sidecar,nomirror,urfave_cli_no_docs
SIDECAR_MITM_TAGS := sidecar,urfave_cli_no_docs
SIDECAR_LDFLAGS := -ldflags "-s -w $(LDFLAGS)"
SIDECAR_BUILD := CGO_ENABLED=0 $(GO) build -trimpath -tags $(SIDECAR_TAGS) $(SIDECAR_LDFLAGS)
SIDECAR_MITM_BUILD := CGO_ENABLED=0 $(GO) build -trimpath -tags $(SIDECAR_MITM_TAGS) $(SIDECAR_LDFLAGS)
sidecar:
	$(SIDECAR_BUILD) -o $(BIN)/proxyfleet-sidecar ./cmd/proxyfleet
	$(SIDECAR_MITM_BUILD) -o $(BIN)/proxyfleet-sidecar-mitm ./cmd/proxyfleet

## image: the controller and sidecar images as OCI archives (bin/proxyfleet-image.tar,
## bin/proxyfleet-sidecar-image.tar) of make build's and make sidecar's static binaries, without
## Docker (hack/image, go-containerregistry). Load with podman load -i, skopeo copy oci-archive:...,
## or ctr import. A cgo build (make CGO_ENABLED=1 build) would not start on the scratch base: refused.
IMAGE_REPO ?= ghcr.io/proxyfleet
IMAGE_TAG ?= $(VERSION)
IMAGE_CREATED := $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMAGE_REVISION := $(shell git rev-parse HEAD 2>/dev/null)
image: build sidecar
	@for b in $(PROXYFLEET) $(BIN)/proxyfleet-sidecar $(BIN)/proxyfleet-sidecar-mitm; do \
		$(GO) version -m $$b | grep -q 'CGO_ENABLED=0' || { echo "image: $$b is not a static build (CGO_ENABLED=0)" >&2; exit 1; }; done
	$(GO) run ./hack/image --binary $(PROXYFLEET) --out $(BIN)/proxyfleet-image.tar \
		--ref $(IMAGE_REPO)/proxyfleet:$(IMAGE_TAG) --version $(VERSION) --revision "$(IMAGE_REVISION)" --created $(IMAGE_CREATED) \
		--description "proxyfleet: rotating egress gateway and its controller"
	$(GO) run ./hack/image --binary $(BIN)/proxyfleet-sidecar --mitm-binary $(BIN)/proxyfleet-sidecar-mitm --out $(BIN)/proxyfleet-sidecar-image.tar \
		--ref $(IMAGE_REPO)/proxyfleet-sidecar:$(IMAGE_TAG) --version $(VERSION) --revision "$(IMAGE_REVISION)" --created $(IMAGE_CREATED) \
		--title proxyfleet-sidecar --description "proxyfleet gateway without the controller, for the injected sidecar"

## run: build and start the gateway on the embedded defaults (127.0.0.1:3128, one direct member),
## with the lease API on 127.0.0.1:8090 (where `proxyfleet lease` looks) and metrics on 127.0.0.1:9090.
run: build
	$(PROXYFLEET) gateway --lease-api-listen 127.0.0.1:8090

## test: install what is missing, then every check and every test suite, the cluster tests last
## (root; cold, they add about 17 minutes on a quiet 2-core machine: docs/cluster.md).
test: deps envtest-bins verify-generated fmt-check vet build sidecar unit fuzz e2e cluster-test

deps:
	@hack/install-deps.sh

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null; git ls-files --others --exclude-standard '*.go' 2>/dev/null)); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## vet: go vet (every build: full, both sidecars, with their gateway packages' tests) and staticcheck,
## pinned (from the Go module proxy, cached after the first run).
STATICCHECK_VERSION := v0.8.2
vet:
	$(GO) vet ./...
	$(GO) vet -tags $(SIDECAR_TAGS) ./cmd/proxyfleet ./gateway/...
	$(GO) vet -tags $(SIDECAR_MITM_TAGS) ./cmd/proxyfleet
	$(GO) vet -tags cluster ./internal/testkit/node/ ./e2e/
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) -tags $(SIDECAR_TAGS) ./gateway/...

## unit: under the race detector, which needs cgo: a compile of its own in any case.
unit: deps envtest-bins build
	PROXYFLEET_BIN=$(PROXYFLEET) CGO_ENABLED=1 $(GO) test -race -count=1 $$($(GO) list ./... | grep -v /e2e)

## fuzz: a short run of each fuzz target (the seed corpus also runs in unit); FUZZTIME=2000000x for longer.
## The budget is a count, not a duration: with a duration, go1.26's fuzz coordinator can fail a clean run with
## "context deadline exceeded" at the deadline (golang/go#75804, fixed in go1.27).
FUZZTIME ?= 100000x
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseUsername$$' -fuzztime $(FUZZTIME) ./gateway/params
	$(GO) test -run '^$$' -fuzz '^FuzzParseHeaders$$' -fuzztime $(FUZZTIME) ./gateway/params
	$(GO) test -run '^$$' -fuzz '^FuzzParsePaceHeaders$$' -fuzztime $(FUZZTIME) ./gateway/params
	$(GO) test -run '^$$' -fuzz '^FuzzClientPaceMeetsTheOperators$$' -fuzztime $(FUZZTIME) ./gateway/pacing
	$(GO) test -run '^$$' -fuzz '^FuzzUpstreamAnswer$$' -fuzztime $(FUZZTIME) ./rotation
	$(GO) test -run '^$$' -fuzz '^FuzzReadConnectAnswer$$' -fuzztime $(FUZZTIME) ./gateway/link
	$(GO) test -run '^$$' -fuzz '^FuzzClientRequest$$' -fuzztime $(FUZZTIME) ./gateway
	$(GO) test -run '^$$' -fuzz '^FuzzParseUpstreamsFile$$' -fuzztime $(FUZZTIME) ./pool
	$(GO) test -run '^$$' -fuzz '^FuzzParseHello$$' -fuzztime $(FUZZTIME) ./gateway/mirror
	$(GO) test -run '^$$' -fuzz '^FuzzServerShare$$' -fuzztime $(FUZZTIME) ./gateway/mirror
	$(GO) test -run '^$$' -fuzz '^FuzzMirroredHandshake$$' -fuzztime $(FUZZTIME) ./gateway/mirror
	$(GO) test -run '^$$' -fuzz '^FuzzH2Print$$' -fuzztime $(FUZZTIME) ./gateway/sitelink
	$(GO) test -run '^$$' -fuzz '^FuzzHeaderBlockGuard$$' -fuzztime $(FUZZTIME) ./gateway/sitelink
	$(GO) test -run '^$$' -fuzz '^FuzzLeaseAPIBodies$$' -fuzztime $(FUZZTIME) ./pool/leaseapi
	$(GO) test -run '^$$' -fuzz '^FuzzPaceAPIBodies$$' -fuzztime $(FUZZTIME) ./pool/leaseapi
	$(GO) test -run '^$$' -fuzz '^FuzzTierAPIBodies$$' -fuzztime $(FUZZTIME) ./pool/leaseapi
	$(GO) test -run '^$$' -fuzz '^FuzzQuotaAPIBodies$$' -fuzztime $(FUZZTIME) ./pool/leaseapi
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $(FUZZTIME) ./providers
	$(GO) test -run '^$$' -fuzz '^FuzzReadConfig$$' -fuzztime $(FUZZTIME) ./providers/kubernetes
	$(GO) test -run '^$$' -fuzz '^FuzzReadConfig$$' -fuzztime $(FUZZTIME) ./providers/gcp
	$(GO) test -run '^$$' -fuzz '^FuzzReadConfig$$' -fuzztime $(FUZZTIME) ./providers/kvm
	$(GO) test -run '^$$' -fuzz '^FuzzReadConfig$$' -fuzztime $(FUZZTIME) ./providers/aws
	$(GO) test -run '^$$' -fuzz '^FuzzReadConfig$$' -fuzztime $(FUZZTIME) ./providers/digitalocean
	$(GO) test -run '^$$' -fuzz '^FuzzReadConfig$$' -fuzztime $(FUZZTIME) ./providers/hetzner
	$(GO) test -run '^$$' -fuzz '^FuzzParseBanRule$$' -fuzztime $(FUZZTIME) ./rotation
	$(GO) test -run '^$$' -fuzz '^FuzzURL$$' -fuzztime $(FUZZTIME) ./internal/redact
	$(GO) test -run '^$$' -fuzz '^FuzzParseHosts$$' -fuzztime $(FUZZTIME) ./gateway/sites
	$(GO) test -run '^$$' -fuzz '^FuzzParseDurations$$' -fuzztime $(FUZZTIME) ./gateway/sites
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./internal/clustertargets
	$(GO) test -run '^$$' -fuzz '^FuzzParseSitePaces$$' -fuzztime $(FUZZTIME) ./gateway/pacing
	$(GO) test -run '^$$' -fuzz '^FuzzParsePorts$$' -fuzztime $(FUZZTIME) ./gateway/sites
	$(GO) test -run '^$$' -fuzz '^FuzzParseRetryAfter$$' -fuzztime $(FUZZTIME) ./rotation
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./gateway/clients
	$(GO) test -run '^$$' -fuzz '^FuzzWriteHead$$' -fuzztime $(FUZZTIME) ./internal/httphead
	$(GO) test -run '^$$' -fuzz '^FuzzWriteOrdered$$' -fuzztime $(FUZZTIME) ./internal/httphead
	$(GO) test -run '^$$' -fuzz '^FuzzReorder$$' -fuzztime $(FUZZTIME) ./internal/httphead
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./internal/fieldorder
	$(GO) test -run '^$$' -fuzz '^FuzzParseStatusList$$' -fuzztime $(FUZZTIME) ./rotation
	$(GO) test -run '^$$' -fuzz '^FuzzParseTarget$$' -fuzztime $(FUZZTIME) ./rotation
	$(GO) test -run '^$$' -fuzz '^FuzzParseTiers$$' -fuzztime $(FUZZTIME) ./rotation
	$(GO) test -run '^$$' -fuzz '^FuzzParseSelector$$' -fuzztime $(FUZZTIME) ./pool
	$(GO) test -run '^$$' -fuzz '^FuzzParseRedisURL$$' -fuzztime $(FUZZTIME) ./pool/redisstore

## guest-image: the Debian guest the kvm end-to-end test boots (hack/guest-image.sh: mmdebstrap, the cloud
## kernel, systemd-boot, cloud-init, Squid) at bin/guest-image.qcow2; cached under the sha256 of its recipe.
GUEST_IMAGE := $(BIN)/guest-image.qcow2
guest-image: deps
	@hack/guest-image.sh $(GUEST_IMAGE)

e2e: deps build sidecar envtest-bins guest-image
	PROXYFLEET_BIN=$(PROXYFLEET) PROXYFLEET_SIDECAR_BIN=$(BIN)/proxyfleet-sidecar PROXYFLEET_SIDECAR_MITM_BIN=$(BIN)/proxyfleet-sidecar-mitm PROXYFLEET_GUEST_IMAGE=$(GUEST_IMAGE) $(GO) test -count=1 -timeout 35m ./e2e/...

## envtest-bins: build kube-apiserver and etcd for envtest into bin/k8s/ (minutes, once; reused until the pins change).
envtest-bins:
	@GO="$(GO)" hack/envtest-bins.sh $(ENVTEST_BIN_DIR)

## node-bins: kubelet, kube-proxy, kube-scheduler, kube-controller-manager and kubectl for the
## single-node cluster tests into bin/node/ (one go build from e2e/tools/node; minutes, once; reused
## until the pins change). etcd and kube-apiserver are envtest-bins'.
NODE_BIN_DIR := $(BIN)/node
node-bins:
	@GO="$(GO)" hack/node-bins.sh $(NODE_BIN_DIR)

## squid-rootfs: Debian's squid in a minimal root (mmdebstrap) at bin/squid-rootfs.tar, the Squid
## image the cluster tests import into their node (hack/rootfs.sh); cached under the sha256 of its recipe.
SQUID_ROOTFS := $(BIN)/squid-rootfs.tar
squid-rootfs: deps
	@hack/rootfs.sh squid $(SQUID_ROOTFS)

## crawler-rootfs: Debian's curl, python3 and python3-requests in a minimal root at
## bin/crawler-rootfs.tar, the crawler image of the cluster tests; cached like squid-rootfs.
CRAWLER_ROOTFS := $(BIN)/crawler-rootfs.tar
crawler-rootfs: deps
	@hack/rootfs.sh crawler $(CRAWLER_ROOTFS)

## cluster-test: the tests on a real single-node cluster (internal/testkit/node: etcd, kube-apiserver,
## kube-controller-manager, kube-scheduler, containerd, runc, CNI, kubelet, kube-proxy), built with
## -tags cluster. Root (they fail, never skip, without it); make test runs them. See docs/cluster.md.
## The chart is installed with the controller and sidecar images of make image, named proxyfleet.local/*:dev.
cluster-test: deps build envtest-bins node-bins squid-rootfs crawler-rootfs
	$(MAKE) image IMAGE_REPO=proxyfleet.local IMAGE_TAG=dev
	PROXYFLEET_BIN=$(PROXYFLEET) PROXYFLEET_SQUID_ROOTFS=$(SQUID_ROOTFS) PROXYFLEET_CRAWLER_ROOTFS=$(CRAWLER_ROOTFS) $(GO) test -tags cluster -count=1 -timeout 30m \
		-run '^(TestNode|TestCluster)' ./internal/testkit/node/ ./e2e/

## cluster: the same single-node cluster as cluster-test, for people (root): the chart installed as
## release proxyfleet in proxyfleet-system with the local images, a ProxyPool demo of 3 Squid Pods in
## namespace egress, a site in namespace sites and a crawler looping GETs to it through its sidecar in
## namespace crawlers. It keeps running after make returns (bin/cluster: kubeconfig, kubectl, exec,
## README.txt, cluster.log); make cluster-down removes it. See docs/cluster.md.
CLUSTER_DIR := $(BIN)/cluster
cluster: deps envtest-bins node-bins squid-rootfs crawler-rootfs
	$(MAKE) image IMAGE_REPO=proxyfleet.local IMAGE_TAG=dev
	@mkdir -p $(CLUSTER_DIR)
	$(GO) test -c -tags cluster -o $(CLUSTER_DIR)/e2e.test ./e2e/
	@hack/cluster.sh up $(CLUSTER_DIR) $(CLUSTER_DIR)/e2e.test $(NODE_BIN_DIR)

## cluster-down: stop the cluster of make cluster: its processes, mounts, network namespace (veths,
## bridges, iptables rules) go, the kernel settings the kubelet changed are put back.
cluster-down:
	@hack/cluster.sh down $(CLUSTER_DIR)

## helm: the helm CLI from the Go module proxy into bin/tools/ (the tests use the Helm SDK
## directly; this is for humans: bin/tools/helm-v3.22.0 install ...).
HELM_VERSION := v3.22.0
HELM := $(BIN)/tools/helm-$(HELM_VERSION)
$(HELM):
	@mkdir -p $(BIN)/tools/.gobin
	GOBIN=$(BIN)/tools/.gobin $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	mv $(BIN)/tools/.gobin/helm $@
helm: $(HELM)

## chart-lint: helm lint and helm template of charts/proxyfleet with the CLI (make test does the
## same through the SDK in charts/chart_test.go).
chart-lint: $(HELM)
	$(HELM) lint charts/proxyfleet
	$(HELM) template proxyfleet charts/proxyfleet --namespace proxyfleet-system --include-crds --kube-version 1.37.2 > /dev/null
	$(HELM) template proxyfleet charts/proxyfleet --namespace proxyfleet-system --kube-version 1.37.2 \
		--set webhook.certManager.enabled=true,sharedGateway.enabled=true,metrics.serviceMonitor.enabled=true,metrics.grafanaDashboard.enabled=true,metrics.prometheusRule.enabled=true > /dev/null

$(CONTROLLER_GEN):
	@mkdir -p $(BIN)/tools/.gobin
	GOBIN=$(BIN)/tools/.gobin $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(BIN)/tools/.gobin/controller-gen $@

## generate: deepcopy functions and the CRDs (charts/proxyfleet/crds/, their one home) from the api/ markers.
generate: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object paths=./api/...
	rm -f charts/proxyfleet/crds/proxyfleet.io_*.yaml
	$(CONTROLLER_GEN) crd:crdVersions=v1 paths=./api/... output:crd:artifacts:config=charts/proxyfleet/crds

## verify-generated: fail when the committed generated files are stale.
verify-generated:
	@hack/verify-generated.sh $(MAKE) --no-print-directory generate

## bench: the gateway against Squid side by side, the floor relay, the MITM references (Squid
## ssl-bump, mitmproxy: hack/bench-deps.sh), the lease store, and a thousand External Proxies
## from creation to Ready on envtest (make test runs the same test with 200).
bench: deps build sidecar envtest-bins
	@hack/bench-deps.sh $(BIN)/bench/squid-openssl
	PROXYFLEET_BIN=$(PROXYFLEET) PROXYFLEET_SIDECAR_BIN=$(BIN)/proxyfleet-sidecar PROXYFLEET_SIDECAR_MITM_BIN=$(BIN)/proxyfleet-sidecar-mitm $(GO) run ./e2e/bench
	PROXYFLEET_BIN=$(PROXYFLEET) PROXYFLEET_FLEET_STARTUP_PROXIES=1000 $(GO) test -count=1 -v -run '^TestManyProxiesReady$$' ./e2e/

clean:
	rm -rf $(BIN)
