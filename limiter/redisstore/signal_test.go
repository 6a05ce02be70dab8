package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// holdHook holds every command and pipeline until open is closed.
type holdHook struct{ open chan struct{} }

func (h holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		<-h.open
		return next(ctx, cmd)
	}
}

func (h holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		<-h.open
		return next(ctx, cmds)
	}
}

// TestAnsweredCallIsLeftAlone: a call that run answers before its round
// trip, because its deadline passed while it queued, is its caller's from
// then on, and a Node reuses it at once; run must not answer it again when
// the round trip ends. It did, once the caller had cleared the call's
// error: the call's next use found an answer waiting that was not its
// own, or, sending the call itself, waited forever to give its own, which
// stalled the store (a fault test saw it after Redis had stalled).
func TestAnsweredCallIsLeftAlone(t *testing.T) {
	client := testenv.Redis(t)
	open := make(chan struct{})
	client.AddHook(holdHook{open})
	q := &queue{client: client}
	cfg := newConfig(Options{Prefix: testenv.RandomName("answered-") + ":"}, true)
	rate := limiter.Params{Burst: 10, Count: 10, Period: time.Second}.Rate()
	call := func(timeout time.Duration) *scriptCall {
		c := &scriptCall{parts: make([]part, 1), done: make(chan struct{}, 1)}
		c.bound(context.Background(), timeout)
		c.parts[0].run = cfg.run(scriptRun{}, limiter.Spend, time.Now().UnixMicro(), []limiter.Bucket{{Key: []byte("1:k"), Rate: rate, Cost: 1}})
		return c
	}
	ended := call(time.Nanosecond)
	live := call(10 * time.Second)
	time.Sleep(time.Millisecond) // ended's deadline is past

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	finished := make(chan struct{})
	go func() {
		q.run(ctx, []*scriptCall{ended, live}, &roundTrip{})
		close(finished)
	}()
	<-ended.done
	if ended.err == nil {
		t.Fatal("a call past its deadline was answered without an error")
	}
	// As Node.Apply does before it puts the call back in its pool.
	ended.err = nil
	close(open)
	<-finished
	<-live.done
	if err := live.parts[0].err; err != nil {
		t.Fatalf("the call sent: %v", err)
	}
	if n := len(ended.done); n != 0 {
		t.Fatalf("run answered a call it had answered before: %d answers wait in it", n)
	}
}
