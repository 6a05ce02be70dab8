package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The bench compares the service with this answer byte for byte in size and
// checks "allowed" in it as in the service's; the waiting ceiling answers
// the same, to every one of the requests it holds at once.
func TestPostAnswersFixedSpendShapedJSON(t *testing.T) {
	for _, wait := range []time.Duration{0, time.Millisecond} {
		t.Run(wait.String(), func(t *testing.T) {
			srv := httptest.NewServer(handler(wait))
			defer srv.Close()
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() { checkAnswer(t, srv.URL) })
			}
			wg.Wait()
		})
	}
}

func checkAnswer(t *testing.T, url string) {
	resp, err := http.Post(url+"/v1/spend", "application/json", strings.NewReader(`{"buckets":[]}`))
	if err != nil {
		t.Error(err)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
		return
	}
	if resp.StatusCode != http.StatusOK || len(body) != 150 {
		t.Errorf("got %d with %d bytes, want 200 with 150", resp.StatusCode, len(body))
		return
	}
	var v struct{ Allowed bool }
	if err := json.Unmarshal(body, &v); err != nil || !v.Allowed {
		t.Errorf("answer %s: allowed %v, err %v", body, v.Allowed, err)
	}
}

func TestOtherMethodsAreRefused(t *testing.T) {
	srv := httptest.NewServer(handler(0))
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/v1/spend")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d, want 405", resp.StatusCode)
	}
}

// The gRPC yardstick answers ShouldRateLimit OK over a real listener, as
// ghz calls it in the bench: a call it failed would be counted as an error
// there, and its CPU per call would not be a call's.
func TestGRPCAnswersOK(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = serveGRPC(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "bench"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("overall code %v, want OK", resp.GetOverallCode())
	}
}
