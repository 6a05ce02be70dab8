package api_test

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// settle is a settle bucket of limit and id.
func settle(limit, id string, reserved, actual int64) obj {
	return obj{"limit": limit, "bucket_id": id, "reserved": reserved, "actual": actual}
}

// storeEnvs runs f on a service over each store: in-process, Redis and
// Redis Cluster.
func storeEnvs(t *testing.T, f func(t *testing.T, e *env)) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			var opts []envOption
			if s := st.store(t); s != nil {
				opts = append(opts, withStore(s))
			}
			f(t, newEnv(t, opts...))
		})
	}
}

// TestSettleWorkedExample is the language-model gateway of docs/api.md,
// step by step: each answer as the page shows it.
func TestSettleWorkedExample(t *testing.T) {
	storeEnvs(t, func(t *testing.T, e *env) {
		e.putLimit("LLMTokensPerMinute", obj{"id_format": "string", "burst": 100000, "count": 100000, "period": "1m", "unit": "tokens"})
		e.waitLimit("LLMTokensPerMinute")
		step := func(op string, b obj, allowed bool, remaining, debt, retry int64, ratelimit string) decision {
			t.Helper()
			r, res := e.decided(op, e.admin, b)
			d := r.Decisions[0]
			if r.Allowed != allowed || d.Allowed != allowed || d.Remaining != remaining || d.Debt != debt || d.RetryAfterMS != retry || d.Unit != "tokens" {
				t.Fatalf("%s %v: %+v", op, b, r)
			}
			if got := res.header.Get("RateLimit"); got != ratelimit {
				t.Errorf("%s: RateLimit %q, want %q", op, got, ratelimit)
			}
			if got := res.header.Get("RateLimit-Policy"); got != `"LLMTokensPerMinute";q=100000;w=60` {
				t.Errorf("%s: RateLimit-Policy %q", op, got)
			}
			return d
		}
		// Reserve an estimate of 4,000 tokens, then settle with the 1,200
		// the model really used: 2,800 come back.
		step("spend", bucket("LLMTokensPerMinute", "key-42", 4000), true, 96000, 0, 0, `"LLMTokensPerMinute";r=96000;t=3`)
		d := step("settle", settle("LLMTokensPerMinute", "key-42", 4000, 1200), true, 98800, 0, 0, `"LLMTokensPerMinute";r=98800;t=1`)
		if d.Capped == nil || *d.Capped {
			t.Errorf("capped %v", d.Capped)
		}
		// A long answer: 150,000 tokens on a 4,000 estimate. The bucket
		// goes 51,200 tokens into debt.
		step("spend", bucket("LLMTokensPerMinute", "key-42", 4000), true, 94800, 0, 0, `"LLMTokensPerMinute";r=94800;t=4`)
		step("settle", settle("LLMTokensPerMinute", "key-42", 4000, 150000), true, 0, 51200, 0, `"LLMTokensPerMinute";r=0;t=91`)
		// Until the debt is paid, nothing more is admitted: the next
		// estimate of 4,000 is 55,200 tokens of 0.6 ms away.
		_, res := e.decided("spend", e.admin, bucket("LLMTokensPerMinute", "key-42", 4000))
		if res.header.Get("Retry-After") != "34" {
			t.Errorf("Retry-After %q", res.header.Get("Retry-After"))
		}
		step("spend", bucket("LLMTokensPerMinute", "key-42", 4000), false, 0, 51200, 33120, `"LLMTokensPerMinute";r=0;t=34`)
		// A spend of 1 would wait for 51,201 tokens.
		step("spend", bucket("LLMTokensPerMinute", "key-42", 1), false, 0, 51200, 30721, `"LLMTokensPerMinute";r=0;t=31`)
		step("check", bucket("LLMTokensPerMinute", "key-42", 0), false, 0, 51200, 30720, `"LLMTokensPerMinute";r=0;t=31`)
		e.clock.Advance(31 * time.Second)
		step("check", bucket("LLMTokensPerMinute", "key-42", 0), true, 466, 0, 0, `"LLMTokensPerMinute";r=466;t=60`)
		// One settle never puts a bucket more than one burst into debt.
		d = step("settle", settle("LLMTokensPerMinute", "key-7", 0, 1000000), true, 0, 100000, 0, `"LLMTokensPerMinute";r=0;t=120`)
		if d.Capped == nil || !*d.Capped {
			t.Errorf("capped %v", d.Capped)
		}
		metrics := e.do("GET", "/metrics", e.admin, nil).expect(t, http.StatusOK).body
		for _, want := range []string{
			`ratelimitd_settled_tokens_total{kind="returned",limit="LLMTokensPerMinute",unit="tokens"} 2800`,
			`ratelimitd_settled_tokens_total{kind="charged",limit="LLMTokensPerMinute",unit="tokens"} 146000`,
			`ratelimitd_settled_tokens_total{kind="capped",limit="LLMTokensPerMinute",unit="tokens"} 1e+06`,
		} {
			if !contains(metrics, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})
}

// bucketModel is a bucket of burst tokens, refilled one token a second,
// as the contract describes it in whole tokens: used is what the bucket
// owes against full, at most two bursts.
type bucketModel struct{ burst, used int64 }

func (m *bucketModel) elapse(secs int64) { m.used = max(0, m.used-secs) }

func (m *bucketModel) remaining() int64 { return max(0, m.burst-m.used) }
func (m *bucketModel) debt() int64      { return max(0, m.used-m.burst) }

// ask says what a spend or check of cost answers: allowed, and the
// milliseconds until it would be.
func (m *bucketModel) ask(cost int64) (bool, int64) {
	switch {
	case cost > m.burst:
		return false, -1
	case m.used+cost <= m.burst:
		return true, 0
	}
	return false, (m.used + cost - m.burst) * 1000
}

// TestSettleSequence runs random spends, checks, refunds and settles with
// steps of the clock against bucketModel, on every store.
func TestSettleSequence(t *testing.T) {
	storeEnvs(t, func(t *testing.T, e *env) {
		e.putLimit("Model", obj{"id_format": "string", "burst": 10, "count": 10, "period": "10s", "unit": "bytes"})
		e.waitLimit("Model")
		m := bucketModel{burst: 10}
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range 300 {
			if rng.IntN(3) == 0 {
				secs := int64(rng.IntN(8))
				e.clock.Advance(time.Duration(secs) * time.Second)
				m.elapse(secs)
			}
			step := strconv.Itoa(i)
			var (
				op                     string
				b                      obj
				allowed, capped        bool
				retry                  int64
				cost, reserved, actual = int64(rng.IntN(13)), int64(rng.IntN(15)), int64(rng.IntN(25))
			)
			switch rng.IntN(4) {
			case 0:
				op, b = "spend", bucket("Model", "b", int(cost))
				allowed, retry = m.ask(cost)
				if allowed {
					m.used += cost
				}
			case 1:
				op, b = "check", bucket("Model", "b", int(cost))
				allowed, retry = m.ask(cost)
			case 2:
				op, b = "refund", bucket("Model", "b", int(cost))
				allowed = cost > 0 && m.used > 0
				m.used = max(0, m.used-cost)
			default:
				op, b, allowed = "settle", settle("Model", "b", reserved, actual), true
				if actual < reserved {
					m.used = max(0, m.used-(reserved-actual))
				} else if excess := actual - reserved; m.used+excess > 2*m.burst {
					m.used, capped = max(m.used, 2*m.burst), excess > 0
				} else {
					m.used += excess
				}
			}
			r, res := e.decided(op, e.admin, b)
			d := r.Decisions[0]
			remaining := m.remaining()
			if op == "check" && allowed {
				// A check answers what a spend would leave.
				remaining -= cost
			}
			if d.Allowed != allowed || d.Remaining != remaining || d.Debt != m.debt() || d.RetryAfterMS != retry {
				t.Fatalf("step %s: %s %v with %d used: got allowed %v remaining %d debt %d retry %d; want %v %d %d %d",
					step, op, b, m.used, d.Allowed, d.Remaining, d.Debt, d.RetryAfterMS, allowed, remaining, m.debt(), retry)
			}
			if op == "settle" && (d.Capped == nil || *d.Capped != capped) {
				t.Fatalf("step %s: settle %v: capped %v, want %v", step, b, d.Capped, capped)
			}
			if op != "settle" && d.Capped != nil {
				t.Fatalf("step %s: a %s says capped", step, op)
			}
			if want := `"Model";r=` + strconv.FormatInt(remaining, 10) + ";"; !contains([]byte(res.header.Get("RateLimit")), want) {
				t.Fatalf("step %s: RateLimit %q, want r=%d", step, res.header.Get("RateLimit"), remaining)
			}
			if got := res.header.Get("RateLimit-Policy"); got != `"Model";q=10;qu="content-bytes";w=10` {
				t.Fatalf("RateLimit-Policy %q", got)
			}
		}
	})
}

// TestSettleIsAllOrNothing shows that a settle with one bad bucket changes
// no bucket, on every store, and that a blocked or unlimited bucket is left
// alone.
func TestSettleIsAllOrNothing(t *testing.T) {
	storeEnvs(t, func(t *testing.T, e *env) {
		e.limit("PerAccount", "reg_id", 5, 5, "5s")
		e.waitLimit("PerAccount")
		e.override(obj{"limit": "PerAccount", "bucket_id": "2", "burst": 0, "count": 1, "period": "1s"})
		e.override(obj{"limit": "PerAccount", "bucket_id": "3", "unlimited": true})
		e.waitSource("PerAccount", "3", limiter.SourceUnlimited)
		p := e.decide("settle", e.admin, settle("PerAccount", "1", 0, 5), settle("PerAccount", "1x", 0, 5)).
			expect(t, http.StatusUnprocessableEntity).problem(t)
		wantFields(t, p, "buckets[1].bucket_id")
		r, _ := e.decided("check", e.admin, bucket("PerAccount", "1", 0))
		if d := r.Decisions[0]; d.Remaining != 5 || d.Debt != 0 {
			t.Fatalf("a refused settle changed a bucket: %+v", d)
		}
		r, res := e.decided("settle", e.admin, settle("PerAccount", "1", 0, 7), settle("PerAccount", "2", 0, 7), settle("PerAccount", "3", 0, 7))
		if r.Allowed || r.Decisions[0].Debt != 2 || !r.Decisions[0].Allowed || r.Decisions[1].reason() != "blocked" ||
			!r.Decisions[2].Allowed || r.Decisions[2].Remaining != 5 || r.Decisions[2].Debt != 0 {
			t.Fatalf("%+v", r)
		}
		if res.header.Get("Retry-After") != "" {
			t.Errorf("Retry-After %q on a settle", res.header.Get("Retry-After"))
		}
	})
}

// TestLimitUnit shows a limit's unit: checked, counting requests unless
// told otherwise, kept by an import that cannot name it, and answered in
// decisions.
func TestLimitUnit(t *testing.T) {
	for _, eng := range engines {
		t.Run(eng.name, func(t *testing.T) {
			e := newEnv(t, eng.opts...)
			for _, bad := range []any{"", "Tokens", "1st", "kilo bytes", "tökens", "a\x00b", "x" + strings.Repeat("y", 32)} {
				p := e.do("PUT", "/v1/limits/Tokens", e.admin, obj{"id_format": "string", "burst": 5, "count": 5, "period": "1m", "unit": bad}).
					expect(t, http.StatusUnprocessableEntity).problem(t)
				wantFields(t, p, "unit")
			}
			e.do("PUT", "/v1/limits/Tokens", e.admin, obj{"id_format": "string", "burst": 5, "count": 5, "period": "1m", "unit": 5}).
				expect(t, http.StatusBadRequest)
			if l := e.limit("Plain", "string", 5, 5, "1m"); l["unit"] != "requests" {
				t.Errorf("a limit without a unit: %v", l)
			}
			l := e.putLimit("Tokens", obj{"id_format": "string", "burst": 5, "count": 5, "period": "1m", "unit": "llm_tokens-v2"})
			if l["unit"] != "llm_tokens-v2" {
				t.Errorf("unit %v", l["unit"])
			}
			e.imported("kind=defaults", "Tokens: {burst: 9, count: 9, period: 1m, id_format: string}\nFresh: {burst: 9, count: 9, period: 1m, id_format: string}\n", 1, 1, 0)
			for name, want := range map[string]string{"Tokens": "llm_tokens-v2", "Fresh": "requests"} {
				got := e.do("GET", "/v1/limits/"+name, e.admin, nil).expect(t, http.StatusOK).object(t)
				if got["unit"] != want || got["burst"] != float64(9) {
					t.Errorf("%s after the import: %v", name, got)
				}
			}
			e.waitFor("the import", func(s *limiter.Snapshot) bool { l, ok := s.Limit("Tokens"); return ok && l.Burst == 9 })
			if r, _ := e.decided("check", e.admin, bucket("Tokens", "x", 1)); r.Decisions[0].Unit != "llm_tokens-v2" {
				t.Errorf("decision %+v", r.Decisions[0])
			}
		})
	}
}

// TestConcurrentSettles sends settles and spends of one bucket at once:
// none is lost, on every store, so the debt is exactly what the admitted
// spends took beyond what the settles charged.
func TestConcurrentSettles(t *testing.T) {
	storeEnvs(t, func(t *testing.T, e *env) {
		// The test's clock stands still: nothing refills.
		e.limit("Slow", "string", 100, 100, "100s")
		e.waitLimit("Slow")
		var (
			wg       sync.WaitGroup
			admitted atomic.Int64
		)
		for i := range 40 {
			wg.Go(func() {
				if i%2 == 0 {
					e.decided("settle", e.admin, settle("Slow", "b", 1, 6))
				} else if r, _ := e.decided("spend", e.admin, bucket("Slow", "b", 1)); r.Allowed {
					admitted.Add(1)
				}
			})
		}
		wg.Wait()
		// 20 settles charge 100, the whole burst; each admitted spend 1.
		// A settle of nothing reads the store: a check could be answered
		// from the denied cache, whose TAT is only a lower bound when
		// requests race.
		r, _ := e.decided("settle", e.admin, settle("Slow", "b", 0, 0))
		if d := r.Decisions[0]; d.Remaining != 0 || d.Debt != admitted.Load() {
			t.Fatalf("after 20 settles of 5 and %d admitted spends: %+v", admitted.Load(), d)
		}
	})
}
