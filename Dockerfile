# A static binary on a small non-root image.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
# The Go client is a module of its own that the service's requires
# through a replace directive (./client): its go.mod is needed to resolve.
COPY client/go.mod client/go.sum ./client/
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/ratelimitd ./cmd/ratelimitd

FROM alpine:3.20
RUN adduser -D -H -u 10001 ratelimitd && mkdir /data && chown ratelimitd /data
COPY --from=build /out/ratelimitd /usr/local/bin/ratelimitd
USER ratelimitd
WORKDIR /data
ENV RATELIMIT_HTTP_ADDR=0.0.0.0:8080 \
    RATELIMIT_GRPC_ADDR=0.0.0.0:8081 \
    RATELIMIT_DATABASE_URL=sqlite:/data/ratelimitd.db
EXPOSE 8080 8081
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
    CMD wget -q -O /dev/null http://127.0.0.1:8080/readyz || exit 1
ENTRYPOINT ["ratelimitd"]
CMD ["serve"]
