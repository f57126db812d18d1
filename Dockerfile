# The same image make image writes without Docker (hack/image): a scratch
# base, the static binary, the build machine's CA roots, user 65532.
#   docker build -t proxyfleet .                                 # controller + gateway
#   docker build --build-arg TAGS=sidecar -t proxyfleet-sidecar .  # the injected sidecar
FROM golang:1.26 AS build
ARG TAGS=""
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The sidecar is built as make sidecar and make image build it: stripped (-s -w, 6.7 MB less in
# every crawler pod) and without the CLI library's unused doc writers (urfave_cli_no_docs); its
# /proxyfleet also without ClientHello mirroring (nomirror), and /proxyfleet-mitm with it, what the
# injection webhook runs for MITM pods. The full image links /proxyfleet-mitm to its one binary.
RUN set -e; strip=""; mitm_tags=""; case ",${TAGS}," in *,sidecar,*) strip="-s -w"; \
      mitm_tags="${TAGS},urfave_cli_no_docs"; TAGS="${TAGS},nomirror,urfave_cli_no_docs";; esac; \
    mkdir -p /out/bin; \
    CGO_ENABLED=0 go build -trimpath -tags "${TAGS}" -ldflags "${strip} -X main.version=${VERSION}" -o /out/bin/proxyfleet ./cmd/proxyfleet; \
    if [ -n "${mitm_tags}" ]; then \
      CGO_ENABLED=0 go build -trimpath -tags "${mitm_tags}" -ldflags "${strip} -X main.version=${VERSION}" -o /out/bin/proxyfleet-mitm ./cmd/proxyfleet; \
    else ln -s proxyfleet /out/bin/proxyfleet-mitm; fi; \
    printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' > /out/passwd; \
    printf 'root:x:0:\nnonroot:x:65532:\n' > /out/group

FROM scratch
ARG VERSION=dev
LABEL org.opencontainers.image.title="proxyfleet" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/proxyfleet/proxyfleet"
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/passwd /etc/passwd
COPY --from=build /out/group /etc/group
COPY --from=build /out/bin/ /
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
ENTRYPOINT ["/proxyfleet"]
