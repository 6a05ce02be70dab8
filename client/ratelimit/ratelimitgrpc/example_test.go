package ratelimitgrpc_test

import (
	"log"
	"os"

	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/client/ratelimit"
	"github.com/ratelimitd/ratelimitd/client/ratelimit/ratelimitgrpc"
)

// A gRPC server spends a token of CallsPerKey, keyed by each call's
// x-api-key metadata, for every call and every stream.
func Example() {
	rl, err := ratelimit.New(ratelimit.Config{URL: "http://ratelimitd:8080", Token: os.Getenv("RATELIMIT_TOKEN")})
	if err != nil {
		log.Fatal(err)
	}
	rule := ratelimitgrpc.Rule{Limit: "CallsPerKey", Key: ratelimitgrpc.Metadata("x-api-key")}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(ratelimitgrpc.UnaryServerInterceptor(rl, rule)),
		grpc.StreamInterceptor(ratelimitgrpc.StreamServerInterceptor(rl, rule)),
	)
	_ = srv // register the services and serve
}
