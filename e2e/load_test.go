//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client"
)

// answer is what a decision request got, as a client sees it.
type answer int

const (
	// normal: 200, a decision made with the store.
	normal answer = iota
	// degraded: 200, allowed and "degraded": true (fail mode open).
	degraded
	// unavailable: 503 problem+json with Retry-After (fail mode closed).
	unavailable
	// other: anything else; never acceptable.
	other
)

func (a answer) String() string {
	return [...]string{"normal", "degraded", "unavailable", "other"}[a]
}

// sample is one decision request of a load.
type sample struct {
	// bucket is the first bucket's id.
	bucket string
	start  time.Time
	// latency is the time until the response's headers came.
	latency time.Duration
	answer  answer
	// allowed and source are the decision's, for normal and degraded
	// answers; source is the first bucket's.
	allowed bool
	source  client.DecisionSource
	// what describes an answer of kind other.
	what string
}

func (s sample) end() time.Time { return s.start.Add(s.latency) }

// load sends spends from several goroutines until stopped, and records
// every answer.
type load struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	samples []sample
}

// startLoad runs workers goroutines, each sending one spend of body(w, i)
// every pace (or back to back when pace is 0) through the clients in turn.
func startLoad(t *testing.T, clients []*client.ClientWithResponses, workers int, pace time.Duration, body func(w, i int) client.DecisionRequest) *load {
	l := &load{stop: make(chan struct{})}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			var tick <-chan time.Time
			if pace > 0 {
				tk := time.NewTicker(pace)
				defer tk.Stop()
				tick = tk.C
			}
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				s := spend(clients[(w+i)%len(clients)], body(w, i))
				l.mu.Lock()
				l.samples = append(l.samples, s)
				l.mu.Unlock()
				if tick != nil {
					select {
					case <-l.stop:
						return
					case <-tick:
					}
				}
			}
		}()
	}
	t.Cleanup(func() { l.halt() })
	return l
}

// spend sends one spend and classifies its answer.
func spend(c *client.ClientWithResponses, body client.DecisionRequest) sample {
	s := sample{bucket: body.Buckets[0].BucketID, start: time.Now()}
	res, err := c.SpendWithResponse(withTiming(context.Background(), &s.latency), body)
	switch {
	case err != nil:
		if s.latency == 0 {
			s.latency = time.Since(s.start)
		}
		s.answer, s.what = other, err.Error()
	case res.JSON200 != nil:
		s.allowed = res.JSON200.Allowed
		if len(res.JSON200.Decisions) > 0 {
			s.source = res.JSON200.Decisions[0].Source
		}
		s.answer = normal
		if res.JSON200.Degraded {
			s.answer = degraded
			if !res.JSON200.Allowed {
				s.answer, s.what = other, "degraded but denied"
			}
		}
	case res.StatusCode() == http.StatusServiceUnavailable && res.ApplicationProblemJSON503 != nil &&
		res.HTTPResponse.Header.Get("Retry-After") != "":
		s.answer = unavailable
	default:
		s.answer, s.what = other, fmt.Sprintf("%d %s", res.StatusCode(), res.Body)
	}
	return s
}

// since returns the samples that started at or after t.
func (l *load) since(t time.Time) []sample {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []sample
	for _, s := range l.samples {
		if !s.start.Before(t) {
			out = append(out, s)
		}
	}
	return out
}

// halt stops the load and returns every sample, in the order they ended.
func (l *load) halt() []sample {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.samples)
}

// between returns the samples that started in [from, to).
func between(samples []sample, from, to time.Time) []sample {
	var out []sample
	for _, s := range samples {
		if !s.start.Before(from) && s.start.Before(to) {
			out = append(out, s)
		}
	}
	return out
}

// latencies summarises the latencies of samples.
type latencies struct {
	n             int
	p50, p99, max time.Duration
}

func summarize(samples []sample) latencies {
	if len(samples) == 0 {
		return latencies{}
	}
	d := make([]time.Duration, len(samples))
	for i, s := range samples {
		d[i] = s.latency
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return latencies{n: len(d), p50: at(0.50), p99: at(0.99), max: d[len(d)-1]}
}

func (l latencies) String() string {
	return fmt.Sprintf("n=%d p50=%v p99=%v max=%v", l.n, l.p50.Round(100*time.Microsecond), l.p99.Round(100*time.Microsecond), l.max.Round(100*time.Microsecond))
}

// count returns how many samples got each answer.
func count(samples []sample) map[answer]int {
	out := map[answer]int{}
	for _, s := range samples {
		out[s.answer]++
	}
	return out
}

// warmUp runs a load until one run of it gets nothing but normal answers,
// at most three times, and fails the test after the third. It is the
// precondition of a fault test, not its subject: on a machine loaded by
// other tests one store call can outlast a short store timeout and answer
// degraded before any fault, which says nothing of the fault to come; a
// service that keeps doing so still fails here.
func warmUp(t *testing.T, run func() []sample) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		bad := -1
		samples := run()
		for i, s := range samples {
			if s.answer != normal {
				bad = i
				break
			}
		}
		if bad < 0 {
			return
		}
		if attempt == 3 {
			t.Fatalf("before the fault, in each of 3 warm-ups: a %v answer (%s)", samples[bad].answer, samples[bad].what)
		}
		t.Logf("warm-up %d: a %v answer (%s); warming up again", attempt, samples[bad].answer, samples[bad].what)
	}
}
