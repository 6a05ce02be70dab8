package ratelimit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client/internal/fakeratelimitd"
)

// acquire acquires one unit of L's bucket "job" with ttl, failing the test
// unless a lease is held.
func acquire(t *testing.T, c *Client, ctx context.Context, ttl time.Duration) *Lease {
	t.Helper()
	r, err := c.Acquire(ctx, ttl, Bucket{Limit: "L", ID: "job", Cost: 1})
	if err != nil || !r.Allowed || r.Lease == nil {
		t.Fatalf("acquire: %+v, %v", r, err)
	}
	return r.Lease
}

// TestLeaseRenews: a held lease is renewed every third of its ttl, and
// Release frees it and stops the renewals.
func TestLeaseRenews(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1})
	c := newClient(t, f, Config{Timeout: time.Minute})
	l := acquire(t, c, context.Background(), 150*time.Millisecond)
	waitFor(t, "three renewals", func() bool { return f.Op("renew") >= 3 })
	if l.Err() != nil {
		t.Errorf("a renewed lease: %v", l.Err())
	}
	select {
	case <-l.Done():
		t.Fatal("Done closed while the lease is held")
	default:
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	renewals := f.Op("renew")
	if f.Op("release") != 1 || l.Err() != nil {
		t.Errorf("%d releases, Err %v", f.Op("release"), l.Err())
	}
	// A release is safe to repeat, and sends nothing more.
	if err := l.Release(context.Background()); err != nil || f.Op("release") != 1 {
		t.Errorf("a second release: %v, %d releases", err, f.Op("release"))
	}
	time.Sleep(200 * time.Millisecond)
	if f.Op("renew") != renewals {
		t.Errorf("renewed %d times after the release", f.Op("renew")-renewals)
	}
	// The unit is free again.
	if r, err := c.Acquire(context.Background(), time.Second, Bucket{Limit: "L", ID: "job", Cost: 1}); err != nil || !r.Allowed {
		t.Errorf("acquiring the released unit: %+v, %v", r, err)
	}
}

// TestLeaseContext: the end of the context given to Acquire releases the
// lease.
func TestLeaseContext(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1})
	c := newClient(t, f, Config{Timeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	l := acquire(t, c, ctx, time.Minute)
	cancel()
	<-l.Done()
	if !errors.Is(l.Err(), context.Canceled) || f.Op("release") != 1 {
		t.Errorf("Err %v, %d releases", l.Err(), f.Op("release"))
	}
}

// TestLeaseLost: a renewal that finds the lease gone ends it, and says so.
func TestLeaseLost(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1})
	c := newClient(t, f, Config{Timeout: time.Minute})
	l := acquire(t, c, context.Background(), 90*time.Millisecond)
	f.DropLeases()
	<-l.Done()
	var p *Problem
	if err := l.Err(); !errors.Is(err, ErrLeaseLost) || !errors.As(err, &p) || p.Status != 404 || p.Detail == "" {
		t.Errorf("Err %v, want ErrLeaseLost with the renewal's 404 and its detail", err)
	}
	if err := l.Release(context.Background()); err != nil || f.Op("release") != 0 {
		t.Errorf("releasing a lost lease: %v, %d releases sent", err, f.Op("release"))
	}
}

// TestLeaseDeadService: renewals that keep failing end the lease when it
// expires, with the cause; failing open changes nothing there. A 404 of
// the whole request (a ratelimitd without /v1/decisions) is such a
// failure, not the lease's own 404.
func TestLeaseDeadService(t *testing.T) {
	notFound := func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"type":"urn:ratelimitd:problem:not-found","title":"Not Found","status":404,"detail":"no such route"}`))
		return true
	}
	for name, fault := range map[string]func(http.ResponseWriter, *http.Request) bool{"5xx": faults["5xx"], "404 of the route": notFound} {
		t.Run(name, func(t *testing.T) {
			f := fakeratelimitd.New(t, map[string]int64{"L": 1})
			var dead atomic.Bool
			f.Fault = func(w http.ResponseWriter, r *http.Request) bool { return dead.Load() && fault(w, r) }
			c := newClient(t, f, Config{Timeout: time.Minute, FailOpen: true, BreakerFailures: 1000})
			start := time.Now()
			l := acquire(t, c, context.Background(), 900*time.Millisecond)
			dead.Store(true)
			<-l.Done()
			if !errors.Is(l.Err(), ErrLeaseExpired) || !errors.Is(l.Err(), ErrUnavailable) {
				t.Errorf("Err %v, want ErrLeaseExpired wrapping ErrUnavailable", l.Err())
			}
			if took := time.Since(start); took < 900*time.Millisecond {
				t.Errorf("the lease ended %v after it was acquired, before its ttl of 900ms", took)
			}
			// The acquire, the renewal at 300ms, and retries every 75ms
			// until 900ms: a loaded machine may delay some, not all.
			if n := len(f.Arrived); n < 3 {
				t.Errorf("%d requests: the renewals were not retried", n)
			}
		})
	}
}

// TestLeaseFailOpen: an acquire ratelimitd does not answer, failing open,
// is allowed with a lease that holds nothing and is released without a
// request.
func TestLeaseFailOpen(t *testing.T) {
	f := fakeratelimitd.New(t, map[string]int64{"L": 1})
	f.Close()
	c := newClient(t, f, Config{FailOpen: true})
	r, err := c.Acquire(context.Background(), time.Second, Bucket{Limit: "L", ID: "job", Cost: 1})
	if err != nil || !r.Allowed || !r.Degraded || r.Lease == nil || r.Lease.ID() != "" {
		t.Fatalf("%+v, %v", r, err)
	}
	if err := r.Lease.Release(context.Background()); err != nil {
		t.Error(err)
	}
	<-r.Lease.Done()
}

// when is fault while on holds; the fake's Fault is set before it
// serves, and switched on later through on.
func when(on *atomic.Bool, fault func(w http.ResponseWriter, r *http.Request) bool) func(w http.ResponseWriter, r *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool { return on.Load() && fault(w, r) }
}

// leaseProblem answers every renew or release of a request with a 422
// naming lease_id, as ratelimitd words one, and the rest as the fake.
func leaseProblem(op string) func(w http.ResponseWriter, r *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"op":"`+op+`"`) {
			r.Body = io.NopCloser(bytes.NewReader(body))
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"results":[{"problem":{"type":"urn:ratelimitd:problem:validation","title":"Unprocessable Entity","status":422,` +
			`"detail":"the request has invalid values","request_id":"r-1","errors":[{"field":"lease_id","message":"must be a lease id as acquire returns it"}]}}]}`))
		return true
	}
}

// refusedRenewal acquires a lease of 90ms, of the one unit of limit L on
// a fake, and turns fault on, which answers the lease's renewal; it
// returns once the lease has ended, with fault still on.
func refusedRenewal(t *testing.T, fault func(w http.ResponseWriter, r *http.Request) bool) (*fakeratelimitd.Server, *atomic.Bool, *Client, *Lease) {
	t.Helper()
	f := fakeratelimitd.New(t, map[string]int64{"L": 1})
	on := new(atomic.Bool)
	f.Fault = when(on, fault)
	c := newClient(t, f, Config{Timeout: time.Minute})
	l := acquire(t, c, context.Background(), 90*time.Millisecond)
	on.Store(true)
	<-l.Done()
	return f, on, c, l
}

// namesLeaseID reports whether err is a *Problem whose field errors name
// lease_id.
func namesLeaseID(err error) bool {
	var p *Problem
	return errors.As(err, &p) && p.Status == 422 && len(p.Errors) == 1 && p.Errors[0].Field == "lease_id" &&
		p.RequestID == "r-1" && strings.Contains(err.Error(), "lease_id")
}

// TestLeaseRefusalNamesField: a renewal or a release that ratelimitd
// refuses naming lease_id ends with an error that still names it, through
// the package's *Problem, as the refusal of a bucket id names the bucket.
func TestLeaseRefusalNamesField(t *testing.T) {
	t.Run("renew", func(t *testing.T) {
		_, _, _, l := refusedRenewal(t, leaseProblem("renew"))
		if err := l.Err(); !namesLeaseID(err) || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrUnavailable) {
			t.Errorf("Err %v, want the problem naming lease_id", err)
		}
	})
	t.Run("release", func(t *testing.T) {
		f := fakeratelimitd.New(t, map[string]int64{"L": 1})
		var on atomic.Bool
		f.Fault = when(&on, leaseProblem("release"))
		c := newClient(t, f, Config{Timeout: time.Minute})
		l := acquire(t, c, context.Background(), time.Minute)
		on.Store(true)
		if err := l.Release(context.Background()); !namesLeaseID(err) {
			t.Errorf("Release: %v, want the problem naming lease_id", err)
		}
	})
}

// refuseLeaseIDs refuses a whole request that holds a renew or a release
// with a 400 naming each one's lease_id by its place in the body, as
// ratelimitd names the fields of a body it cannot read; it answers other
// requests as the fake.
func refuseLeaseIDs(w http.ResponseWriter, r *http.Request) bool {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req struct{ Requests []struct{ Op string } }
	json.Unmarshal(body, &req)
	var fields []string
	for i, q := range req.Requests {
		if q.Op == "renew" || q.Op == "release" {
			fields = append(fields, `{"field":"requests[`+strconv.Itoa(i)+`].lease_id","message":"is not valid UTF-8"}`)
		}
	}
	if fields == nil {
		return false
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusBadRequest)
	w.Write([]byte(`{"type":"urn:ratelimitd:problem:bad-request","title":"Bad Request","status":400,"detail":"the body is not valid UTF-8",` +
		`"request_id":"r-2","errors":[` + strings.Join(fields, ",") + `]}`))
	return true
}

// TestLeaseRefusedWhole: when ratelimitd refuses a whole request naming a
// release's or renewal's lease_id by its place in the body, that call's
// error names lease_id, its own field, and the calls beside it in the
// request get the problem without fields that are not theirs.
func TestLeaseRefusedWhole(t *testing.T) {
	t.Run("release", func(t *testing.T) {
		f := fakeratelimitd.New(t, map[string]int64{"L": 10})
		var on atomic.Bool
		gate := make(chan struct{})
		f.Fault = when(&on, func(w http.ResponseWriter, r *http.Request) bool { <-gate; return refuseLeaseIDs(w, r) })
		c := newClient(t, f, Config{Timeout: time.Minute})
		l := acquire(t, c, context.Background(), time.Minute)
		on.Store(true)
		// A spend holds the one request in flight; a spend and the release
		// queue behind it and go together.
		held := make(chan struct{})
		go func() { c.Spend(context.Background(), Bucket{Limit: "L", ID: "a", Cost: 1}); close(held) }()
		waitFor(t, "the first request", func() bool { return len(f.Arrived) == 2 })
		var spendErr, releaseErr error
		var wg sync.WaitGroup
		wg.Go(func() { _, spendErr = c.Spend(context.Background(), Bucket{Limit: "L", ID: "b", Cost: 1}) })
		waitFor(t, "the spend queued", func() bool { return queued(c) == 1 })
		wg.Go(func() { releaseErr = l.Release(context.Background()) })
		waitFor(t, "the release queued", func() bool { return queued(c) == 2 })
		close(gate)
		wg.Wait()
		<-held
		var p *Problem
		if !errors.As(releaseErr, &p) || len(p.Errors) != 1 || p.Errors[0].Field != "lease_id" || p.RequestID != "r-2" || errors.Is(releaseErr, ErrUnavailable) {
			t.Errorf("the release: %v, want the problem naming lease_id", releaseErr)
		}
		if !errors.As(spendErr, &p) || len(p.Errors) != 0 || p.BadBucketID() || errors.Is(spendErr, ErrUnavailable) {
			t.Errorf("the spend beside it: %v, want the problem without the release's field", spendErr)
		}
	})
	t.Run("renew", func(t *testing.T) {
		_, _, _, l := refusedRenewal(t, refuseLeaseIDs)
		var p *Problem
		if err := l.Err(); !errors.As(err, &p) || len(p.Errors) != 1 || p.Errors[0].Field != "lease_id" || errors.Is(err, ErrUnavailable) {
			t.Errorf("Err %v, want the problem naming lease_id", err)
		}
	})
}

// TestLeaseReleaseAfterRefusedRenewal: a lease whose renewal ratelimitd
// refused (a 422, not the 404 of a lease gone) may still hold its units
// there: Release frees them, as after renewals that failed.
func TestLeaseReleaseAfterRefusedRenewal(t *testing.T) {
	f, on, c, l := refusedRenewal(t, leaseProblem("renew"))
	on.Store(false)
	if err := l.Release(context.Background()); err != nil || f.Op("release") != 1 {
		t.Errorf("Release: %v, %d releases sent", err, f.Op("release"))
	}
	if r, err := c.Acquire(context.Background(), time.Second, Bucket{Limit: "L", ID: "job", Cost: 1}); err != nil || !r.Allowed {
		t.Errorf("acquiring the released unit: %+v, %v", r, err)
	}
}
