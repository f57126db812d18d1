# The two commands the README promises: `make run` and `make test`.
SHELL := /usr/bin/env bash
GO ?= go
BIN := $(CURDIR)/bin
PROXYFLEET := $(BIN)/proxyfleet
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# envtest: the real kube-apiserver and etcd, built from e2e/tools into bin/k8s/.
ENVTEST_BIN_DIR := $(BIN)/k8s

.PHONY: all build run test deps fmt-check vet unit e2e bench clean envtest-bins

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(PROXYFLEET) ./cmd/proxyfleet

## run: build and start the gateway on the embedded defaults (127.0.0.1:3128, one direct member).
run: build
	$(PROXYFLEET) gateway

## test: install what is missing, then every check and every test suite.
test: deps envtest-bins fmt-check vet build unit e2e

deps:
	@hack/install-deps.sh

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null; git ls-files --others --exclude-standard '*.go' 2>/dev/null)); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

unit: envtest-bins
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /e2e)

e2e: build envtest-bins
	PROXYFLEET_BIN=$(PROXYFLEET) $(GO) test -count=1 -timeout 20m ./e2e/...

## envtest-bins: build kube-apiserver and etcd for envtest into bin/k8s/ (minutes, once; reused until the pins change).
envtest-bins:
	@hack/envtest-bins.sh $(ENVTEST_BIN_DIR)

## bench: the gateway against Squid side by side, and the lease store.
bench: deps build
	PROXYFLEET_BIN=$(PROXYFLEET) $(GO) run ./e2e/bench

clean:
	rm -rf $(BIN)
