//go:build linux

package e2e

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/client"
)

// bg is the context of requests that a test does not cancel; the
// clients' own timeout bounds them.
var bg = context.Background()

// putLimit creates or replaces a limit through the API, failing the test
// unless it is answered 200 or 201.
func putLimit(t *testing.T, c *client.ClientWithResponses, name string, l client.LimitPut) client.Limit {
	t.Helper()
	res, err := c.PutLimitWithResponse(bg, name, l)
	if err != nil {
		t.Fatalf("PUT /v1/limits/%s: %v", name, err)
	}
	switch {
	case res.JSON201 != nil:
		return *res.JSON201
	case res.JSON200 != nil:
		return *res.JSON200
	}
	t.Fatalf("PUT /v1/limits/%s: %d %s", name, res.StatusCode(), res.Body)
	return client.Limit{}
}

// createToken creates a token through the API and returns its secret.
func createToken(t *testing.T, c *client.ClientWithResponses, name string, scope client.Scope) string {
	t.Helper()
	res, err := c.CreateTokenWithResponse(bg, client.TokenCreate{Name: name, Scope: scope})
	if err != nil {
		t.Fatalf("POST /v1/tokens: %v", err)
	}
	if res.JSON201 == nil {
		t.Fatalf("POST /v1/tokens: %d %s", res.StatusCode(), res.Body)
	}
	return res.JSON201.Token
}

// createOverride creates an override through the API, failing the test
// unless it is answered 201.
func createOverride(t *testing.T, c *client.ClientWithResponses, o client.OverrideCreate) client.Override {
	t.Helper()
	res, err := c.CreateOverrideWithResponse(bg, o)
	if err != nil {
		t.Fatalf("POST /v1/overrides: %v", err)
	}
	if res.JSON201 == nil {
		t.Fatalf("POST /v1/overrides: %d %s", res.StatusCode(), res.Body)
	}
	return *res.JSON201
}

// check asks for a decision on one bucket without spending (cost 0 when
// cost is 0) and fails the test unless it is answered 200.
func check(t *testing.T, c *client.ClientWithResponses, limit, bucket string, cost int64) client.Decision {
	t.Helper()
	res, err := c.CheckWithResponse(bg, client.DecisionRequest{Buckets: []client.BucketRequest{{Limit: limit, BucketID: bucket, Cost: &cost}}})
	if err != nil {
		t.Fatalf("POST /v1/check: %v", err)
	}
	if res.JSON200 == nil {
		t.Fatalf("POST /v1/check: %d %s", res.StatusCode(), res.Body)
	}
	return res.JSON200.Decisions[0]
}

// bucket is a decision request for one bucket at cost 1.
func bucket(limit, id string) client.DecisionRequest {
	return client.DecisionRequest{Buckets: []client.BucketRequest{{Limit: limit, BucketID: id}}}
}

// waitFor polls cond every 10 ms until it holds and returns how long that
// took, or fails the test after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// probe is one answer of /readyz.
type probe struct {
	at     time.Time
	status int
	detail string
}

// readiness polls /readyz every 25 ms until stopped.
type readiness struct {
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	probes []probe
}

func watchReadiness(t *testing.T, s *service) *readiness {
	r := &readiness{stop: make(chan struct{}), done: make(chan struct{})}
	c := s.client("")
	go func() {
		defer close(r.done)
		for {
			p := probe{at: time.Now()}
			res, err := c.ReadyzWithResponse(bg)
			switch {
			case err != nil:
				p.detail = err.Error()
			case res.ApplicationProblemJSON503 != nil:
				p.status, p.detail = res.StatusCode(), res.ApplicationProblemJSON503.Detail
			default:
				p.status = res.StatusCode()
			}
			r.mu.Lock()
			r.probes = append(r.probes, p)
			r.mu.Unlock()
			select {
			case <-r.stop:
				return
			case <-time.After(25 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { r.halt() })
	return r
}

// halt stops polling and returns every probe.
func (r *readiness) halt() []probe {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]probe(nil), r.probes...)
}

// firstAfter returns the first probe at or after t whose status is
// status.
func firstAfter(probes []probe, t time.Time, status int) (probe, bool) {
	for _, p := range probes {
		if !p.at.Before(t) && p.status == status {
			return p, true
		}
	}
	return probe{}, false
}

// redisClients is the number of clients connected to a redis-server, but
// the one that asks (INFO clients).
func redisClients(t *testing.T, addr string) int {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "clients").Result()
	if err != nil {
		t.Fatalf("INFO clients on %s: %v", addr, err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("INFO clients: %q", line)
			}
			return n - 1
		}
	}
	t.Fatalf("INFO clients on %s has no connected_clients:\n%s", addr, info)
	return 0
}

// waitKnown waits until the process c talks to decides on limit: the
// loader applies a change after it is committed, so a limit just created
// may still be unknown (422) to decisions for a moment. It returns how
// long that took.
func waitKnown(t *testing.T, c *client.ClientWithResponses, limit, bucketID string) time.Duration {
	t.Helper()
	return waitFor(t, 10*time.Second, "limit "+limit+" known to decisions", func() bool {
		_, ok := inspect(c, limit, bucketID)
		return ok
	})
}

// usesOverride reports whether the process c talks to decides on a bucket
// with an override of the given burst: false too while the limit itself
// is not known yet (422), since the loader applies changes after they are
// committed.
func usesOverride(c *client.ClientWithResponses, limit, bucketID string, burst int64) bool {
	d, ok := inspect(c, limit, bucketID)
	return ok && d.Source == client.DecisionSourceOverride && d.Burst == burst
}

// inspect checks a bucket at cost 0 and reports whether it was answered
// with a decision.
func inspect(c *client.ClientWithResponses, limit, bucketID string) (client.Decision, bool) {
	cost := int64(0)
	res, err := c.CheckWithResponse(bg, client.DecisionRequest{Buckets: []client.BucketRequest{{Limit: limit, BucketID: bucketID, Cost: &cost}}})
	if err != nil || res.JSON200 == nil {
		return client.Decision{}, false
	}
	return res.JSON200.Decisions[0], true
}

// describe says what a request got: an error, or a status and body.
func describe(res interface {
	StatusCode() int
}, err error) string {
	if err != nil {
		return err.Error()
	}
	// Every generated response keeps the raw body in its Body field.
	return strconv.Itoa(res.StatusCode()) + " " + string(reflect.ValueOf(res).Elem().FieldByName("Body").Bytes())
}
