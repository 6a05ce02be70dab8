package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/redisstore"
)

// TestConcurrentCallsShareRoundTrips: concurrent spends, which the store
// pipelines, each get their own answer: every bucket ends with exactly the
// TAT its own spends made, and no more round trips than calls are made.
func TestConcurrentCallsShareRoundTrips(t *testing.T) {
	client := testenv.Redis(t)
	var trips roundTrips
	client.AddHook(&trips)
	// A slow wire, so that calls certainly arrive while round trips are
	// under way, and must share the next.
	client.AddHook(slowPipelines{})
	s := redisstore.New(client, redisstore.Options{Prefix: prefix(t, client), Timeout: patient})
	ctx := context.Background()
	const goroutines, spends = 32, 20
	// One spend a second at most: after n allowed spends at the same
	// instant, the TAT is n seconds ahead.
	params := limiter.Params{Burst: spends, Count: 1, Period: time.Second}
	now := time.Now()
	if _, err := s.Apply(ctx, limiter.Check, time.Now(), batchOf("1:warm")); err != nil { // may load the script
		t.Fatal(err)
	}
	trips.n.Store(0)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			key := []byte(fmt.Sprintf("1:g%d", g))
			for i := range spends {
				batch := []limiter.Bucket{{Key: key, Rate: params.Rate(), Cost: 1}}
				if _, err := s.Apply(ctx, limiter.Spend, now, batch); err != nil {
					errs <- err
					return
				}
				// Each spend reads what this goroutine's previous spend
				// wrote, whatever else shared its round trip.
				if want := now.UnixMicro() + int64(i)*time.Second.Microseconds(); i > 0 && batch[0].TAT != want {
					errs <- fmt.Errorf("spend %d of %s read TAT %d, want %d", i, key, batch[0].TAT, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := trips.n.Load(); n >= goroutines*spends {
		t.Errorf("%d round trips for %d spends: none were shared", n, goroutines*spends)
	} else {
		t.Logf("%d spends in %d round trips", goroutines*spends, n)
	}
}

// TestEndedContextSendsNothing: a call whose context has ended returns the
// context's error without a round trip.
func TestEndedContextSendsNothing(t *testing.T) {
	client := testenv.Redis(t)
	var trips roundTrips
	client.AddHook(&trips)
	s := redisstore.New(client, redisstore.Options{Prefix: prefix(t, client), Timeout: patient})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Apply(ctx, limiter.Spend, time.Now(), batchOf("1:cancelled"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if n := trips.n.Load(); n != 0 {
		t.Fatalf("%d round trips for a cancelled call", n)
	}
}

// slowPipelines makes every pipeline take a millisecond longer.
type slowPipelines struct{}

func (slowPipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (slowPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (slowPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		time.Sleep(time.Millisecond)
		return next(ctx, cmds)
	}
}
