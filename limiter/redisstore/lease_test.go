package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
)

// storeCall is one call of a store, named as its errors name it.
type storeCall struct {
	name string
	f    func() error
}

// leaseCalls are the lease calls of s on bucket key, for the tests of a
// server that fails.
func leaseCalls(ctx context.Context, s limiter.Store, key string) []storeCall {
	batch := func() []limiter.LeaseBucket { return []limiter.LeaseBucket{{Key: []byte(key), Burst: 5, Cost: 1}} }
	id := limiter.NewLeaseID()
	return []storeCall{
		{"acquire", func() error {
			rec := limiter.LeaseRecord{ID: id, Expires: time.Now().Add(time.Minute).UnixMicro(), MaxTTL: time.Minute}
			return errOf(s.Acquire(ctx, time.Now(), &rec, batch()))
		}},
		{"held", func() error { return s.Held(ctx, time.Now(), batch()) }},
		{"release", func() error { _, err := s.Release(ctx, time.Now(), id); return err }},
		{"renew", func() error {
			_, err := s.Renew(ctx, time.Now(), id, func(limiter.LeaseRecord) (int64, error) { return time.Now().Add(time.Minute).UnixMicro(), nil })
			return err
		}},
	}
}

// acquire takes a lease of ttl on batch and fails the test unless it was
// granted.
func acquire(t *testing.T, s limiter.Store, now time.Time, ttl time.Duration, batch ...limiter.LeaseBucket) limiter.LeaseRecord {
	t.Helper()
	rec := limiter.LeaseRecord{ID: limiter.NewLeaseID(), Expires: now.Add(ttl).UnixMicro(), MaxTTL: ttl}
	ok, err := s.Acquire(context.Background(), now, &rec, batch)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v %+v", ok, err, batch)
	}
	return rec
}

// TestLeaseRoundTrips: on a single node an acquire and a read are one
// script call each; a release and a renewal read the record first, then
// run one script call.
func TestLeaseRoundTrips(t *testing.T) {
	client := testenv.Redis(t)
	var trips roundTrips
	client.AddHook(&trips)
	s := redisstore.New(client, redisstore.Options{Prefix: prefix(t, client), Timeout: patient})
	ctx := context.Background()
	batch := []limiter.LeaseBucket{{Key: []byte("1:a"), Burst: 9, Cost: 1}, {Key: []byte("2:b"), Burst: 9, Cost: 1}}
	// The first calls may load the script and dial the connections that
	// a pipeline and a command use.
	rec := acquire(t, s, time.Now(), time.Minute, batch...)
	if _, err := s.Release(ctx, time.Now(), rec.ID); err != nil {
		t.Fatal(err)
	}
	for _, call := range []struct {
		name  string
		trips int64
		f     func() error
	}{
		{"acquire", 1, func() error { rec = acquire(t, s, time.Now(), time.Minute, batch...); return nil }},
		{"held", 1, func() error { return s.Held(ctx, time.Now(), batch) }},
		{"renew", 2, func() error {
			_, err := s.Renew(ctx, time.Now(), rec.ID, func(limiter.LeaseRecord) (int64, error) { return time.Now().Add(time.Minute).UnixMicro(), nil })
			return err
		}},
		{"release", 2, func() error { _, err := s.Release(ctx, time.Now(), rec.ID); return err }},
	} {
		trips.n.Store(0)
		if err := call.f(); err != nil {
			t.Fatalf("%s: %v", call.name, err)
		}
		if n := trips.n.Load(); n != call.trips {
			t.Errorf("a %s took %d round trips, want %d", call.name, n, call.trips)
		}
	}
}

// TestLeaseScriptFlushed: leases work on a server that lost the script,
// on a single node and across the slots of a Cluster.
func TestLeaseScriptFlushed(t *testing.T) {
	srv := testenv.RedisServer(t) // SCRIPT FLUSH must not disturb other tests
	node := clientOn(t, srv)
	cluster := clusterClient(t)
	p := spreadPrefix(t, masters(t, cluster))
	t.Cleanup(func() { dropPrefix(t, cluster, p) })
	ctx := context.Background()
	for name, s := range map[string]limiter.Store{
		"node":    redisstore.New(node, redisstore.Options{Timeout: patient}),
		"cluster": redisstore.New(cluster, redisstore.Options{Prefix: p, Timeout: patient}),
	} {
		batch := []limiter.LeaseBucket{{Key: []byte("1:pair"), Burst: 9, Cost: 1}, {Key: []byte("2:pair"), Burst: 9, Cost: 1}}
		flush := func() {
			if err := errors.Join(node.ScriptFlush(ctx).Err(), cluster.ScriptFlush(ctx).Err()); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 2 {
			flush()
			rec := acquire(t, s, time.Now(), time.Minute, batch...)
			if batch[0].Held != int64(i) || batch[1].Held != int64(i) {
				t.Fatalf("%s: lease %d after SCRIPT FLUSH read %+v", name, i, batch)
			}
			flush()
			_, err := s.Renew(ctx, time.Now(), rec.ID, func(limiter.LeaseRecord) (int64, error) { return time.Now().Add(time.Minute).UnixMicro(), nil })
			if err != nil {
				t.Fatalf("%s: renewal after SCRIPT FLUSH: %v", name, err)
			}
		}
	}
}

// TestLeaseOnAnotherType: a bucket key that holds something else than
// leases fails the call, which changes nothing, not even the expired
// leases of the batch's other buckets.
func TestLeaseOnAnotherType(t *testing.T) {
	client := testenv.Redis(t)
	p := prefix(t, client)
	s := redisstore.New(client, redisstore.Options{Prefix: p, Timeout: patient})
	ctx := context.Background()
	if err := client.Set(ctx, p+"2:tat", "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	acquire(t, s, start, time.Second, limiter.LeaseBucket{Key: []byte("1:lease"), Burst: 5, Cost: 1})
	later := start.Add(2 * time.Second)
	rec := limiter.LeaseRecord{ID: limiter.NewLeaseID(), Expires: later.Add(time.Minute).UnixMicro(), MaxTTL: time.Minute}
	batch := []limiter.LeaseBucket{{Key: []byte("1:lease"), Burst: 5, Cost: 1}, {Key: []byte("2:tat"), Burst: 5, Cost: 1}}
	ok, err := s.Acquire(ctx, later, &rec, batch)
	if ok || err == nil || !strings.Contains(err.Error(), "2:tat holds a string") {
		t.Fatalf("an acquire on a TAT: %v, %v", ok, err)
	}
	if err := s.Held(ctx, later, batch); err == nil {
		t.Fatal("a read of a TAT as leases succeeded")
	}
	batch = batch[:1]
	acquire(t, s, later, time.Minute, batch...)
	if batch[0].Expired != 1 || batch[0].Held != 0 {
		t.Fatalf("after the failed acquire the bucket read %+v, want its expired lease still there", batch[0])
	}
}

// TestLeaseStoredForm: the layout docs/design.md describes. A bucket is a
// sorted set of "<id>:<cost>" members scored by expiry and a "held"
// member scored by minus the total; a record is a hash of the expiry, the
// MaxTTL, and the keys and costs of the buckets. Both expire
// ExpiryMargin after the lease, rounded up to the millisecond.
func TestLeaseStoredForm(t *testing.T) {
	client := testenv.Redis(t)
	p := prefix(t, client)
	const margin = 5 * time.Second
	s := redisstore.New(client, redisstore.Options{Prefix: p, Timeout: patient, ExpiryMargin: margin})
	ctx := context.Background()
	now := time.Now()
	a := acquire(t, s, now, 7*time.Second+1234*time.Microsecond, limiter.LeaseBucket{Key: []byte("1:form"), Burst: 9, Cost: 2}, limiter.LeaseBucket{Key: []byte("2:form"), Burst: 9, Cost: 3})
	b := acquire(t, s, now, 3*time.Second, limiter.LeaseBucket{Key: []byte("1:form"), Burst: 9, Cost: 4})
	members, err := client.ZRangeWithScores(ctx, p+"1:form", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range members {
		got = append(got, m.Member.(string)+"="+strconv.FormatFloat(m.Score, 'f', -1, 64))
	}
	want := []string{"held=-6", b.ID + ":4=" + strconv.FormatInt(b.Expires, 10), a.ID + ":2=" + strconv.FormatInt(a.Expires, 10)}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("the bucket holds %v, want %v", got, want)
	}
	fields, err := client.HGetAll(ctx, redisstore.RecordKey(p, a.ID)).Result()
	if err != nil {
		t.Fatal(err)
	}
	wantFields := map[string]string{
		"expires": strconv.FormatInt(a.Expires, 10), "max_ttl": strconv.FormatInt(a.MaxTTL.Microseconds(), 10),
		"key:1": p + "1:form", "cost:1": "2", "key:2": p + "2:form", "cost:2": "3",
	}
	if len(fields) != len(wantFields) {
		t.Fatalf("the record holds %v, want %v", fields, wantFields)
	}
	for k, v := range wantFields {
		if fields[k] != v {
			t.Fatalf("the record holds %v, want %v", fields, wantFields)
		}
	}
	wantAt := (a.Expires + margin.Microseconds() + 999) / 1000
	for _, key := range []string{p + "1:form", redisstore.RecordKey(p, a.ID)} {
		if at, err := client.Do(ctx, "PEXPIRETIME", key).Int64(); err != nil || at != wantAt {
			t.Fatalf("%s expires at %d ms (%v), want %d", key, at, err, wantAt)
		}
	}
}
