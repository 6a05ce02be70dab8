package limiter_test

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// event is one step of a fuzzed sequence: what happened at which time.
type event struct {
	at int64
	// net is the TAT moved by the step: cost·T for an admitted spend, minus
	// what a refund gave back; 0 for denials and checks. A settle moves it
	// either way.
	net int64
	// settled is what a settle charged, the part of its excess that was
	// not capped.
	settled int64
}

// FuzzGCRA runs random sequences of spends, checks, refunds, settles and
// clock steps on one bucket and checks the invariants of the algorithm:
// remaining and debt stay within [0, burst], a spend never moves the TAT
// backwards, a check never moves it at all, a settle charges its excess
// unless capped at one burst of debt, and in any window of length W the
// tokens charged (net of refunds) never exceed burst + W/T + what settles
// charged.
func FuzzGCRA(f *testing.F) {
	f.Add(uint16(20), uint32(50_000), []byte{0, 1, 0, 0, 1, 0, 0, 1, 200, 2, 5, 3, 1, 3, 0})
	f.Add(uint16(1), uint32(1), []byte{0, 1, 1, 0, 1, 1, 2, 1, 0})
	f.Add(uint16(0), uint32(1000), []byte{0, 1, 0, 2, 1, 0})
	f.Add(uint16(65535), uint32(4_000_000_000), []byte{0, 255, 255, 2, 255, 255, 0, 255, 255})
	f.Add(uint16(10), uint32(1000), []byte{0, 10, 0, 3, 30, 0, 0, 1, 16, 7, 255, 0, 0, 1, 40, 3, 5, 0, 0, 1, 255})
	f.Fuzz(func(t *testing.T, burst uint16, interval uint32, ops []byte) {
		if interval == 0 {
			interval = 1
		}
		r := limiter.Rate{Interval: int64(interval), Burst: int64(burst)}
		now := int64(1_800_000_000_000_000)
		var tat int64
		var events []event
		for i := 0; i+2 < len(ops); i += 3 {
			kind, cost := ops[i]%4, int64(ops[i+1])
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
			case 2:
				next, out = limiter.RefundStep(tat, now, r, cost)
				if next > max(tat, now) {
					t.Fatalf("a refund moved the TAT forward from %d to %d", tat, next)
				}
				ev.net = -(max(tat, now) - max(next, now))
			default:
				// The kind byte's high bits are what was reserved.
				reserved := int64(ops[i] >> 2)
				next, out = limiter.SettleStep(tat, now, r, reserved, cost)
				settle(t, tat, now, r, reserved, cost, next, out)
				ev.net = max(next, now) - max(tat, now)
				ev.settled = max(ev.net, 0)
			}
			if out.Remaining < 0 || out.Remaining > r.Burst {
				t.Fatalf("remaining %d outside [0, %d]", out.Remaining, r.Burst)
			}
			if out.Debt < 0 || out.Debt > r.Burst {
				t.Fatalf("debt %d outside [0, %d]", out.Debt, r.Burst)
			}
			if out.ResetAfter < 0 {
				t.Fatalf("negative reset-after: %+v", out)
			}
			tat = next
			events = append(events, ev)
			now += int64(ops[i+2]) * r.Interval / 16
		}
		// Charged tokens in [a, b], in microseconds of TAT: at most
		// burst·T + (b - a) + what settles charged.
		for i := range events {
			var sum, settled int64
			for j := i; j < len(events); j++ {
				sum += events[j].net
				settled += events[j].settled
				if limit := r.Offset() + events[j].at - events[i].at + settled; sum > limit {
					t.Fatalf("events %d..%d admitted %dµs of tokens in %dµs, limit %d", i, j, sum, events[j].at-events[i].at, limit)
				}
			}
		}
	})
}

// settle checks one settle: a blocked bucket is left alone; otherwise it is
// allowed, gives back what was not used, and charges the excess unless that
// would take the TAT past now + 2·burst·T, where it stops, Capped.
func settle(t *testing.T, tat, now int64, r limiter.Rate, reserved, actual, next int64, out limiter.Outcome) {
	t.Helper()
	t0 := max(tat, now)
	switch {
	case r.Burst == 0:
		if out.Allowed || out.Reason != limiter.ReasonBlocked || next != tat {
			t.Fatalf("a settle on a blocked bucket: TAT %d -> %d, %+v", tat, next, out)
		}
		return
	case !out.Allowed || out.Reason != "" || out.RetryAfter != 0:
		t.Fatalf("a settle was not allowed: %+v", out)
	case actual <= reserved:
		if next > t0 || out.Capped {
			t.Fatalf("a settle of %d reserved, %d used moved the TAT from %d to %d: %+v", reserved, actual, tat, next, out)
		}
		return
	}
	limit := now + 2*r.Offset()
	excess := actual - reserved
	switch {
	case next < t0 && next != tat:
		t.Fatalf("a settle that used more than reserved moved the TAT back from %d to %d", tat, next)
	case next > max(t0, limit):
		t.Fatalf("a settle moved the TAT to %d, beyond one burst of debt (%d)", next, limit)
	case out.Capped != (excess > (limit-t0)/r.Interval || t0 >= limit):
		t.Fatalf("a settle of excess %d from TAT %d: capped %v", excess, tat, out.Capped)
	case !out.Capped && next != t0+excess*r.Interval:
		t.Fatalf("a settle of excess %d from TAT %d moved it to %d, not by the excess", excess, tat, next)
	case out.Capped && next != max(limit, tat):
		t.Fatalf("a capped settle moved the TAT to %d, not to the cap %d", next, limit)
	}
}
