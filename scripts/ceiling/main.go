// Command ceiling is the yardstick of `make bench`: a bare net/http server,
// with default settings and nothing but the standard library on its path,
// that answers any POST with a fixed 150-byte JSON body shaped like a
// spend's answer. No HTTP JSON service on the same machine can answer
// faster, so the bench reports each target as a ratio to it, which holds
// across machines where requests/s do not.
//
// With -wait, it is the yardstick of a store that answers from another
// goroutine, as the Redis store does: each handler reads the body to its
// end, as the service does, and then waits until one goroutine, which
// gathers the handlers waiting and answers them together once per wait,
// lets it answer. That goroutine does no work of its own, so what the
// service's CPU per request rises by, from the bare ceiling to this one,
// is what net/http and the scheduler charge a handler for waiting: a park
// and a wake-up, and net/http's background read of the connection, which
// starts when the body has been read and must be stopped before the answer
// (docs/performance.md).
//
// With -grpc, it is the yardstick of the gRPC front instead: grpc-go with
// the settings the service's listener depends on for its speed (a pool of
// goroutines for calls, grpc.NumStreamWorkers, as many as the service
// keeps, and the service's floor under the garbage collector), answering
// every ShouldRateLimit with a fixed OK and nothing else: no token, no
// descriptor read, no decision. What a call costs it under the load of
// Envoy's shape is what grpc-go charges any service for a call, below
// which the service's gRPC front cannot go.
//
// It listens on -addr (a free loopback port by default) and prints
// "ceiling listening on http://ADDR" (grpc://ADDR with -grpc) once it
// accepts connections.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/ratelimitd/ratelimitd/internal/gcfloor"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"
)

// answer is what a one-bucket spend answers, padded to 150 bytes, so that
// the ceiling writes as much as the service does.
const answer = `{"allowed":true,"retry_after_ms":0,"reset_after_ms":1,"decisions":[{"limit":"bench_allowed_one","bucket_id":"1234","allowed":true,"remaining":99999}]}`

// handler answers every POST with answer; with wait > 0, only after
// reading the body and waiting for the next of the rounds that answer the
// handlers waiting, one every wait.
func handler(wait time.Duration) http.Handler {
	var waiting chan chan struct{}
	if wait > 0 {
		waiting = make(chan chan struct{}, 1024)
		go answerEvery(wait, waiting)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if waiting != nil {
			_, _ = io.Copy(io.Discard, r.Body)
			done := make(chan struct{}, 1)
			waiting <- done
			<-done
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(answer))
	})
}

// answerEvery lets the handlers waiting answer, all that came during a
// wait together, as a store's round trip answers the calls it carries.
func answerEvery(wait time.Duration, waiting chan chan struct{}) {
	var round []chan struct{}
	for done := range waiting {
		round = append(round[:0], done)
	gather:
		for {
			select {
			case done := <-waiting:
				round = append(round, done)
			default:
				break gather
			}
		}
		time.Sleep(wait)
		for _, done := range round {
			done <- struct{}{}
		}
	}
}

// rateLimitService answers every ShouldRateLimit with one OK answer.
type rateLimitService struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

// ok is the answer to every call, made once.
var ok = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
	Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}}}

// ShouldRateLimit answers OK without reading the request.
func (rateLimitService) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return ok, nil
}

// streamWorkers and gcHeadroom are the service's own settings (api/rls,
// cmd/ratelimitd), so that the yardstick differs from the service only in
// what it does per call.
const (
	streamWorkers = 128
	gcHeadroom    = 64 << 20
)

// serveGRPC serves the gRPC yardstick on ln until it fails.
func serveGRPC(ln net.Listener) error {
	s := grpc.NewServer(grpc.NumStreamWorkers(streamWorkers))
	rlsv3.RegisterRateLimitServiceServer(s, rateLimitService{})
	// ghz, as grpcurl, learns the call's messages from the server.
	reflection.Register(s)
	return s.Serve(ln)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	wait := flag.Duration("wait", 0, "answer after waiting this long on another goroutine (0: at once)")
	withGRPC := flag.Bool("grpc", false, "answer ShouldRateLimit over gRPC instead of HTTP")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	if *withGRPC {
		gcfloor.Keep(os.Getenv, gcHeadroom)
		fmt.Fprintf(os.Stdout, "ceiling listening on grpc://%s\n", ln.Addr())
		log.Fatal(serveGRPC(ln))
	}
	fmt.Fprintf(os.Stdout, "ceiling listening on http://%s\n", ln.Addr())
	log.Fatal(http.Serve(ln, handler(*wait)))
}
