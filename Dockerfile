# Build the manager binary
FROM golang:1.26 AS builder
ARG TARGETOS
ARG TARGETARCH

WORKDIR /workspace
# Cache the modules before copying the sources, so that source changes do not
# download them again.
COPY go.mod go.sum ./
RUN go mod download

COPY cmd/ cmd/
COPY api/ api/
COPY controllers/ controllers/
COPY internal/ internal/

# CGO off: a static binary for the distroless base image.
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} go build -trimpath -ldflags="-s -w" -o lockwarden ./cmd

# A minimal, non-root runtime image: https://github.com/GoogleContainerTools/distroless
FROM gcr.io/distroless/static:nonroot
# The OCI labels that make image (hack/image) sets too: make docker-build passes
# the version, the commit and its commit time (UTC, RFC 3339).
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="https://github.com/lockwarden/lockwarden" \
      org.opencontainers.image.title="lockwarden" \
      org.opencontainers.image.licenses="Apache-2.0"
WORKDIR /
COPY --from=builder /workspace/lockwarden .
USER 65532:65532

ENTRYPOINT ["/lockwarden"]
