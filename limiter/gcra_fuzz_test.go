package limiter_test

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// event is one step of a fuzzed sequence: what happened at which time.
type event struct {
	at int64
	// net is the TAT moved by the step: cost·T for an admitted spend, minus
	// what a refund gave back; 0 for denials and checks.
	net int64
}

// FuzzGCRA runs random sequences of spends, checks, refunds and clock steps
// on one bucket and checks the invariants of the algorithm: remaining stays
// within [0, burst], a spend never moves the TAT backwards, a check never
// moves it at all, and in any window of length W the tokens admitted (net of
// refunds) never exceed burst + W/T.
func FuzzGCRA(f *testing.F) {
	f.Add(uint16(20), uint32(50_000), []byte{0, 1, 0, 0, 1, 0, 0, 1, 200, 2, 5, 3, 1, 3, 0})
	f.Add(uint16(1), uint32(1), []byte{0, 1, 1, 0, 1, 1, 2, 1, 0})
	f.Add(uint16(0), uint32(1000), []byte{0, 1, 0, 2, 1, 0})
	f.Add(uint16(65535), uint32(4_000_000_000), []byte{0, 255, 255, 2, 255, 255, 0, 255, 255})
	f.Fuzz(func(t *testing.T, burst uint16, interval uint32, ops []byte) {
		if interval == 0 {
			interval = 1
		}
		r := limiter.Rate{Interval: int64(interval), Burst: int64(burst)}
		now := int64(1_800_000_000_000_000)
		var tat int64
		var events []event
		for i := 0; i+2 < len(ops); i += 3 {
			kind, cost := ops[i]%3, int64(ops[i+1])
			if ops[i+1] == 255 {
				cost = 1<<63 - 1
			}
			var next int64
			var out limiter.Outcome
			ev := event{at: now}
			switch kind {
			case 0:
				next, out = limiter.SpendStep(tat, now, r, cost)
				if next < tat {
					t.Fatalf("a spend moved the TAT back from %d to %d", tat, next)
				}
				if out.Allowed {
					ev.net = next - max(tat, now)
				} else if next != tat {
					t.Fatalf("a denied spend moved the TAT from %d to %d", tat, next)
				}
				if !out.Allowed && out.Reason == "" {
					t.Fatalf("a denial without a reason: %+v", out)
				}
				if out.RetryAfter < 0 && out.RetryAfter != limiter.Never {
					t.Fatalf("negative retry-after: %+v", out)
				}
				if out.Allowed && out.RetryAfter != 0 {
					t.Fatalf("allowed with a retry-after: %+v", out)
				}
			case 1:
				_, out = limiter.SpendStep(tat, now, r, cost)
				next = tat // a check writes nothing
			default:
				next, out = limiter.RefundStep(tat, now, r, cost)
				if next > max(tat, now) {
					t.Fatalf("a refund moved the TAT forward from %d to %d", tat, next)
				}
				ev.net = -(max(tat, now) - max(next, now))
			}
			if out.Remaining < 0 || out.Remaining > r.Burst {
				t.Fatalf("remaining %d outside [0, %d]", out.Remaining, r.Burst)
			}
			if out.ResetAfter < 0 {
				t.Fatalf("negative reset-after: %+v", out)
			}
			tat = next
			events = append(events, ev)
			now += int64(ops[i+2]) * r.Interval / 16
		}
		// Admitted tokens in [a, b], in microseconds of TAT: at most
		// burst·T + (b - a).
		for i := range events {
			var sum int64
			for j := i; j < len(events); j++ {
				sum += events[j].net
				if limit := r.Offset() + events[j].at - events[i].at; sum > limit {
					t.Fatalf("events %d..%d admitted %dµs of tokens in %dµs, limit %d", i, j, sum, events[j].at-events[i].at, limit)
				}
			}
		}
	})
}
