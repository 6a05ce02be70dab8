package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestModel runs seeded random sequences of operations against the whole
// service (serve on loopback, on a clock the test steps) and against the
// reference model of model_spec_test.go, and compares every answer. On a
// mismatch it shrinks the sequence by replaying it on fresh services and
// prints the seed and what is left.
//
// Each engine pair runs three sequences of RATELIMIT_MODEL_STEPS
// operations (default 1000), new seeds each time; RATELIMIT_MODEL_SEED
// replays one seed instead, and RATELIMIT_MODEL_DURATION keeps running new
// seeds for that long (make fuzz sets it).
func TestModel(t *testing.T) {
	const runs = 3
	steps := envInt(t, "RATELIMIT_MODEL_STEPS", 1000)
	var duration time.Duration
	if v := os.Getenv("RATELIMIT_MODEL_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("RATELIMIT_MODEL_DURATION: %v", err)
		}
		duration = d
	}
	pairs := []struct {
		name string
		env  func(t *testing.T) map[string]string
	}{
		{"sqlite+memory", func(t *testing.T) map[string]string {
			return map[string]string{"RATELIMIT_DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "model.db")}
		}},
		{"postgres+redis", func(t *testing.T) map[string]string {
			prefix := testenv.RandomName("rlmodel") + ":"
			dropKeys(t, prefix)
			return map[string]string{
				"RATELIMIT_DATABASE_URL": testenv.Postgres(t),
				"RATELIMIT_REDIS_URL":    testenv.RedisURL(t),
				"RATELIMIT_REDIS_PREFIX": prefix,
				// The model compares decisions, not the fail mode: a
				// loaded machine must not turn a slow call into a
				// degraded answer.
				"RATELIMIT_REDIS_TIMEOUT": "10s",
			}
		}},
	}
	for _, pair := range pairs {
		t.Run(pair.name, func(t *testing.T) {
			start := time.Now()
			for run := 0; ; run++ {
				seed := uint64(time.Now().UnixNano())
				if v := os.Getenv("RATELIMIT_MODEL_SEED"); v != "" {
					var err error
					if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
						t.Fatalf("RATELIMIT_MODEL_SEED: %v", err)
					}
				}
				g := newGenerator(seed)
				ops, at, msg, tally := execute(t, pair.env, steps, func(m *model, _ int) op { g.m = m; return g.next() })
				if at >= 0 {
					short, msg := shrink(t, pair.env, ops[:at+1], msg)
					t.Fatalf("seed %d (RATELIMIT_MODEL_SEED=%d RATELIMIT_MODEL_STEPS=%d): operation %d of a shortened sequence:\n%s\n%s",
						seed, seed, steps, len(short)-1, listOps(short), msg)
				}
				t.Logf("seed %d: %d operations as the model says; answers by status: %v", seed, len(ops), tally)
				if os.Getenv("RATELIMIT_MODEL_SEED") != "" || run+1 >= runs && time.Since(start) >= duration {
					t.Logf("measured: %d sequences of %d operations in %v", run+1, steps, time.Since(start).Round(time.Second))
					return
				}
			}
		})
	}
}

// dropKeys deletes the keys under prefix when the test ends: on the
// test's clock, a day ahead, Redis would keep them for a day.
func dropKeys(t *testing.T, prefix string) {
	c := testenv.Redis(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		keys, err := c.Keys(ctx, prefix+"*").Result()
		if err == nil && len(keys) > 0 {
			err = c.Del(ctx, keys...).Err()
		}
		if err != nil {
			t.Errorf("deleting the keys under %s: %v", prefix, err)
		}
	})
}

func envInt(t *testing.T, key string, def int) int {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s: want a whole number above 0, got %q", key, v)
	}
	return n
}

// --- operations ---

type opKind int

const (
	opPutLimit opKind = iota + 1
	opDeleteLimit
	opCreateOverride
	opPatchOverride
	opDeleteOverride
	opImportDefaults
	opImportOverrides
	opCreateToken
	opRevokeToken
	opCheck
	opSpend
	opRefund
	opReset
	opClock
	// opRace sends its two operations at once.
	opRace
	// The operations of leases (model_kinds_test.go).
	opAcquire
	opRelease
	opRenew
	// opMany sends its operations in one request to /v1/decisions
	// (model_many_test.go).
	opMany
)

// bucketOp is one bucket of a decision or a reset.
type bucketOp struct {
	limit, id string
	cost      int64
}

// importEntry is one entry of an imported file.
type importEntry struct {
	limit     string
	format    string // defaults only; "" leaves it out
	params    modelParams
	unlimited bool
	ids       []string // overrides only
}

// op is one operation of a sequence. It names limits, overrides and tokens
// by what the test knows of them (a limit name, an override's limit and
// bucket id, a token's label), never by ids the service gave out, so that
// any subsequence replays.
type op struct {
	kind      opKind
	limit, id string
	format    string
	params    modelParams
	enum      int
	bad       bool // an invalid limit (burst 0)
	unlimited bool
	comment   string
	disable   bool
	expiresIn time.Duration
	patch     string // params, unlimited, disable, enable, expire, noexpiry
	entries   []importEntry
	dryRun    bool
	mapFormat bool
	token     string
	buckets   []bucketOp
	step      time.Duration
	race      []op
	// limitKind, calendar and zone are those of a PUT of a concurrency
	// limit ("concurrency") or quota ("quota"); badField names what makes
	// such a PUT invalid.
	limitKind, calendar, zone string
	badField                  string
	// ifExists sends the PUT only if the limit exists (a change of kind).
	ifExists bool
	// lease labels the lease of an acquire, release or renew; ttlMS is
	// their ttl_ms, -1 to leave it out.
	lease string
	ttlMS int64
	// many are the operations of an opMany.
	many []op
	// cli makes a token create or revoke a run of the command line on the
	// service's database, with the flags after the arguments when
	// flagsLast; the service must then honour it within a second.
	cli, flagsLast bool
}

func (o *op) String() string {
	switch o.kind {
	case opPutLimit:
		s := fmt.Sprintf("PUT limit %s %s %s", o.limit, o.format, o.params)
		if o.limitKind != "" {
			s += fmt.Sprintf(" %s %s %s", o.limitKind, o.calendar, o.zone)
		}
		if o.badField != "" {
			s += " (bad " + o.badField + ")"
		}
		if o.enum > 0 {
			s += fmt.Sprintf(" enum %d", o.enum)
		}
		if o.bad {
			s += " (burst 0)"
		}
		return s
	case opDeleteLimit:
		return "DELETE limit " + o.limit
	case opCreateOverride:
		s := fmt.Sprintf("POST override %s %q ", o.limit, o.id)
		if o.unlimited {
			s += "unlimited"
		} else {
			s += o.params.String()
		}
		if o.comment != "" {
			s += fmt.Sprintf(" comment %q", o.comment)
		}
		if o.disable {
			s += " disabled"
		}
		if o.expiresIn > 0 {
			s += " expires in " + o.expiresIn.String()
		}
		return s
	case opPatchOverride:
		s := fmt.Sprintf("PATCH override %s %q: %s", o.limit, o.id, o.patch)
		switch o.patch {
		case "params":
			s += " " + o.params.String()
		case "expire":
			s += " in " + o.expiresIn.String()
		}
		return s
	case opDeleteOverride:
		return fmt.Sprintf("DELETE override %s %q", o.limit, o.id)
	case opImportDefaults, opImportOverrides:
		kind, doc := importDoc(o)
		return fmt.Sprintf("import %s dry_run=%v:\n\t%s", kind, o.dryRun, strings.ReplaceAll(strings.TrimSpace(doc), "\n", "\n\t"))
	case opCreateToken, opRevokeToken:
		s := map[opKind]string{opCreateToken: "create token ", opRevokeToken: "revoke token "}[o.kind] + o.token
		if o.cli {
			s += fmt.Sprintf(" (command line, flags last %v)", o.flagsLast)
		}
		return s
	case opCheck, opSpend, opRefund:
		s := map[opKind]string{opCheck: "check", opSpend: "spend", opRefund: "refund"}[o.kind]
		for _, b := range o.buckets {
			s += fmt.Sprintf(" %s/%q cost %d", b.limit, b.id, b.cost)
		}
		if o.token != "" {
			s += " with token " + o.token
		}
		return s
	case opReset:
		return fmt.Sprintf("reset %s/%q", o.buckets[0].limit, o.buckets[0].id)
	case opClock:
		return "clock +" + o.step.String()
	case opRace:
		return "at once: " + o.race[0].String() + " | " + o.race[1].String()
	case opAcquire:
		s := "acquire " + o.lease
		for _, b := range o.buckets {
			s += fmt.Sprintf(" %s/%q cost %d", b.limit, b.id, b.cost)
		}
		if o.ttlMS != -1 {
			s += fmt.Sprintf(" ttl_ms %d", o.ttlMS)
		}
		return s
	case opRelease:
		return "release " + o.lease
	case opRenew:
		s := "renew " + o.lease
		if o.ttlMS != -1 {
			s += fmt.Sprintf(" ttl_ms %d", o.ttlMS)
		}
		return s
	case opMany:
		return manyString(o)
	}
	return "?"
}

func listOps(ops []op) string {
	var b strings.Builder
	for i := range ops {
		fmt.Fprintf(&b, "%3d. %s\n", i, ops[i].String())
	}
	return b.String()
}

// --- generation ---

// slot is a limit name the test uses, the id formats it may have and the
// bucket ids it is sent (some of which its formats refuse).
type slot struct {
	name    string
	formats []string
	ids     []string
	// kind is "" for a rate limit, else kindConcurrency or kindQuota.
	kind string
}

var (
	dnsIDs = []string{"example.com", "Example.COM", "example.com.", "shop.example.com", "SHOP.example.com.",
		"www.example.co.uk", "WWW.Example.co.uk.", "bücher.example", "xn--bcher-kva.example", "XN--BCHER-KVA.EXAMPLE.",
		"xn--bucher-xyd.example", "xn--zz.example", "192.0.2.1", "::ffff:192.0.2.1", "2001:db8::1:2", "42"}
	stringIDs = []string{"alice", "Alice", "bob", "example.com", "Example.COM", "a\x00b", "user\xff", "user\xfe"}
	regIDs    = []string{"42", "0042", "00000042", "7", "007", "18446744073709551615", "18446744073709551616", "0", "example.com"}
	ipIDs     = []string{"192.0.2.1", "::ffff:192.0.2.1", "2001:db8::1", "2001:DB8:0:0::1", "2001:db8::1:2", "example.com"}
	slots     = []slot{
		{"Alpha", []string{"domain", "domain_or_cidr", "ident_value"}, dnsIDs, ""},
		{"Beta", []string{"string"}, stringIDs, ""},
		{"Gamma", []string{"reg_id"}, regIDs, ""},
		{"Delta", []string{"ip_address", "ident_value"}, ipIDs, ""},
		{"NewOrdersPerAccount", []string{"reg_id"}, regIDs, ""},
		{"NewRegistrationsPerIPAddress", []string{"ip_address"}, ipIDs, ""},
		{"CertificatesPerDomain", []string{"domain_or_cidr"}, dnsIDs, ""},
		{"Calls", []string{"string"}, []string{"alice", "bob", "carol"}, kindConcurrency},
		{"Quota", []string{"string"}, []string{"alice", "bob"}, kindQuota},
	}
	// comments are those of overrides: mostly none, as imports write them.
	comments = []string{"", "", "", "customer 42", "a\x00b"}
)

// generator makes operations from a seed, steered by the model of the
// run, so that most operations name limits and overrides that exist. As
// long as the service answers as the model says, a seed gives the same
// sequence again.
type generator struct {
	r *rand.Rand
	m *model
}

func newGenerator(seed uint64) *generator {
	return &generator{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

func (g *generator) params(blockable bool) modelParams {
	p := modelParams{
		Burst:  pick(g.r, []int64{1, 2, 3, 5, 10}),
		Count:  pick(g.r, []int64{1, 2, 4, 5, 10}),
		Period: pick(g.r, []time.Duration{time.Second, 2 * time.Second, 10 * time.Second, time.Minute, time.Hour}),
	}
	if blockable && g.r.IntN(6) == 0 {
		p.Burst = 0
	}
	return p
}

// slot picks a limit name, mostly one that exists.
func (g *generator) slot() slot {
	if names := sortedKeys(g.m.limits); len(names) > 0 && g.r.IntN(10) < 8 {
		name := pick(g.r, names)
		for _, s := range slots {
			if s.name == name {
				return s
			}
		}
	}
	return pick(g.r, slots)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// bucket picks a bucket of a limit, mostly in a notation its formats take.
func (g *generator) bucket(s slot) bucketOp {
	b := bucketOp{limit: s.name, id: pick(g.r, s.ids), cost: 1}
	switch n := g.r.IntN(20); {
	case n < 3:
		b.cost = 0
	case n < 5:
		b.cost = 2
	case n < 6:
		b.cost = 20 // above every burst
	case n == 6 && g.r.IntN(4) == 0:
		b.cost = -1
	}
	return b
}

// overrideTarget picks an existing override, in one of the notations
// that name it, or else any bucket.
func (g *generator) overrideTarget() (string, string) {
	var keys []overrideKey
	for k := range g.m.overrides {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b overrideKey) int { return strings.Compare(a.limit+"\x00"+a.bucket, b.limit+"\x00"+b.bucket) })
	if len(keys) > 0 && g.r.IntN(10) < 8 {
		k := pick(g.r, keys)
		s := slotNamed(k.limit)
		var names []string
		for _, id := range s.ids {
			if c, bad := canonical(g.m.limits[k.limit].format, id); bad == 0 && c == k.bucket {
				names = append(names, id)
			}
		}
		if len(names) > 0 {
			return k.limit, pick(g.r, names)
		}
	}
	s := g.slot()
	return s.name, pick(g.r, s.ids)
}

// rateSlot picks a slot of a rate limit, the only kind Boulder's files
// and the races below write.
func (g *generator) rateSlot() slot {
	for {
		if s := g.slot(); s.kind == "" {
			return s
		}
	}
}

func slotNamed(name string) slot {
	for _, s := range slots {
		if s.name == name {
			return s
		}
	}
	panic("no slot " + name)
}

func (g *generator) expiry() time.Duration {
	return pick(g.r, []time.Duration{500 * time.Millisecond, 2 * time.Second, 30 * time.Second, time.Hour})
}

func (g *generator) next() op {
	if o, ok := g.nextKinds(); ok {
		return o
	}
	if o, ok := g.nextMany(); ok {
		return o
	}
	r := g.r
	switch n := r.IntN(100); {
	case n < 30:
		return g.decision(opSpend)
	case n < 40:
		return g.decision(opCheck)
	case n < 46:
		return g.decision(opRefund)
	case n < 56:
		return op{kind: opClock, step: pick(r, []time.Duration{time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
			time.Second, 3 * time.Second, 10 * time.Second, time.Minute, time.Hour})}
	case n < 64:
		return g.putLimit()
	case n < 67:
		return op{kind: opDeleteLimit, limit: g.slot().name}
	case n < 73:
		s := g.slot()
		o := op{kind: opCreateOverride, limit: s.name, id: pick(r, s.ids), params: g.kindParams(s.kind, true)}
		o.unlimited = r.IntN(5) == 0
		o.disable = r.IntN(10) == 0
		o.comment = pick(r, comments)
		if r.IntN(4) == 0 {
			o.expiresIn = g.expiry()
		}
		return o
	case n < 78:
		o := op{kind: opPatchOverride, patch: pick(r, []string{"params", "params", "unlimited", "disable", "enable", "expire", "noexpiry"})}
		o.limit, o.id = g.overrideTarget()
		o.params, o.expiresIn = g.kindParams(slotNamed(o.limit).kind, true), g.expiry()
		return o
	case n < 81:
		o := op{kind: opDeleteOverride}
		o.limit, o.id = g.overrideTarget()
		return o
	case n < 83:
		return g.importDefaults()
	case n < 86:
		return g.importOverrides()
	case n < 89:
		return op{kind: opReset, buckets: []bucketOp{g.bucket(g.slot())}}
	case n < 91:
		return op{kind: opCreateToken, token: "t" + strconv.Itoa(len(g.m.tokens)), cli: r.IntN(3) == 0, flagsLast: r.IntN(2) == 0}
	case n < 93:
		return op{kind: opRevokeToken, token: "t" + strconv.Itoa(r.IntN(len(g.m.tokens)+1)), cli: r.IntN(3) == 0, flagsLast: r.IntN(2) == 0}
	case n < 96:
		o := g.decision(pick(r, []opKind{opCheck, opSpend}))
		o.token = "t" + strconv.Itoa(r.IntN(len(g.m.tokens)+1))
		return o
	case n < 98:
		// An id format change and an override of the limit at once.
		put := g.putLimitOf(g.rateSlot())
		put.bad, put.enum, put.format = false, 0, pick(r, slotNamed(put.limit).formats)
		create := op{kind: opCreateOverride, limit: put.limit, id: pick(r, slotNamed(put.limit).ids), params: g.params(false)}
		return op{kind: opRace, race: []op{put, create}}
	}
	return g.decision(opSpend)
}

func (g *generator) decision(kind opKind) op {
	o := op{kind: kind, buckets: []bucketOp{g.bucket(g.slot())}}
	if g.r.IntN(5) == 0 {
		o.buckets = append(o.buckets, g.bucket(g.slot()))
	}
	return o
}

func (g *generator) putLimit() op { return g.putLimitOf(g.slot()) }

func (g *generator) putLimitOf(s slot) op {
	if s.kind != "" {
		return g.putKindLimit(s)
	}
	o := op{kind: opPutLimit, limit: s.name, format: s.formats[0], params: g.params(false)}
	if l := g.m.limits[s.name]; l != nil {
		o.format = l.format
	}
	if g.r.IntN(5) == 0 {
		o.format = pick(g.r, s.formats)
	}
	o.bad = g.r.IntN(20) == 0
	if _, catalogued := modelCatalogue[s.name]; !catalogued && g.m.limits[s.name] == nil && g.r.IntN(5) == 0 {
		// Numbers free or not, a catalogue number, the largest, and one
		// given before (to a limit that may since have been deleted).
		choices := []int{3, 50, 77, maxEnum}
		for e := range g.m.enums {
			if e >= 100 && e < maxEnum {
				choices = append(choices, e)
			}
		}
		slices.Sort(choices[4:]) // map order is random; a seed must give one sequence
		o.enum = pick(g.r, choices)
	}
	return o
}

func (g *generator) importDefaults() op {
	o := op{kind: opImportDefaults, dryRun: g.r.IntN(3) == 0}
	for range 1 + g.r.IntN(2) {
		s := g.rateSlot()
		e := importEntry{limit: s.name, params: g.params(false)}
		if _, catalogued := modelCatalogue[s.name]; !catalogued {
			e.format = s.formats[0]
			if l := g.m.limits[s.name]; l != nil {
				e.format = l.format
			}
		}
		if g.r.IntN(8) == 0 {
			// A bad entry: nothing of the file may be written.
			e.params.Burst, e.format = 0, ""
		}
		if !slices.ContainsFunc(o.entries, func(x importEntry) bool { return x.limit == e.limit }) {
			o.entries = append(o.entries, e)
		}
	}
	return o
}

func (g *generator) importOverrides() op {
	o := op{kind: opImportOverrides, dryRun: g.r.IntN(3) == 0, mapFormat: g.r.IntN(3) == 0}
	for range 1 + g.r.IntN(2) {
		s := g.rateSlot()
		e := importEntry{limit: s.name, params: g.params(true), unlimited: g.r.IntN(6) == 0}
		for range 1 + g.r.IntN(2) {
			// A file must be UTF-8 to be YAML: ids that are not are sent
			// in decisions and overrides only.
			if id := pick(g.r, s.ids); utf8.ValidString(id) {
				e.ids = append(e.ids, id)
			}
		}
		if len(e.ids) == 0 {
			e.ids = s.ids[:1]
		}
		if !slices.ContainsFunc(o.entries, func(x importEntry) bool { return x.limit == e.limit }) {
			o.entries = append(o.entries, e)
		}
	}
	return o
}

// importDoc writes an import operation's file in Boulder's formats.
func importDoc(o *op) (kind, doc string) {
	var b strings.Builder
	q := func(s string) string { j, _ := json.Marshal(s); return string(j) }
	params := func(indent string, e importEntry) {
		if e.unlimited {
			fmt.Fprintf(&b, "%sunlimited: true\n", indent)
			return
		}
		fmt.Fprintf(&b, "%sburst: %d\n%scount: %d\n%speriod: %s\n", indent, e.params.Burst, indent, e.params.Count, indent, e.params.Period)
	}
	if o.kind == opImportDefaults {
		for _, e := range o.entries {
			fmt.Fprintf(&b, "%s:\n", e.limit)
			params("  ", e)
			if e.format != "" {
				fmt.Fprintf(&b, "  id_format: %s\n", e.format)
			}
		}
		return "defaults", b.String()
	}
	for _, e := range o.entries {
		if o.mapFormat {
			for _, id := range e.ids {
				fmt.Fprintf(&b, "%s:\n", q(e.limit+":"+id))
				params("  ", e)
			}
			continue
		}
		fmt.Fprintf(&b, "- %s:\n", e.limit)
		params("    ", e)
		b.WriteString("    ids:\n")
		for _, id := range e.ids {
			fmt.Fprintf(&b, "      - %s\n", q(id))
		}
	}
	return "overrides", b.String()
}

// --- running ---

// bootstrap is the admin token of every service the test starts.
const bootstrap = "model-test-bootstrap-token"

// shrinkBudget bounds the time spent shortening a failing sequence.
const shrinkBudget = 3 * time.Minute

// execute starts a fresh service on a clock of its own and runs n
// operations, taken from next, on it and on a fresh model, comparing each
// answer. It returns the operations and the index of the first mismatch
// with its description, or -1.
func execute(t *testing.T, env func(*testing.T) map[string]string, n int, next func(*model, int) op) ([]op, int, string, map[int]int) {
	t.Helper()
	// The service's clock stands still but when the test steps it. It
	// starts a day ahead of the wall clock, so that Redis, which expires
	// keys by its own clock, never drops a bucket the model still holds.
	clock := testenv.NewClock(time.Now().Add(24 * time.Hour).Truncate(time.Second))
	e := env(t)
	e["RATELIMIT_BOOTSTRAP_TOKEN"] = bootstrap
	e["RATELIMIT_LOG_LEVEL"] = "warn"
	svc := startServeWith(t, e, func(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) error {
		return serveAt(ctx, clock.Now, nil, getenv, stdout, stderr)
	})
	defer func() { _ = svc.stop() }()
	svc.waitReady(t)
	d := &driver{t: t, url: svc.url, dbURL: e["RATELIMIT_DATABASE_URL"], clock: clock, tokens: map[string]heldToken{}, leases: map[string]string{}, tally: map[int]int{}}
	m := newModel(clock.Now())
	ops := make([]op, 0, n)
	for i := range n {
		ops = append(ops, next(m, i))
		o := &ops[i]
		a := d.do(o)
		if a.order != "" {
			return ops, i, a.order + serviceErrors(svc.stderr.String()), d.tally
		}
		if msg := m.apply(o, a); msg != "" {
			return ops, i, msg + serviceErrors(svc.stderr.String()), d.tally
		}
	}
	return ops, -1, "", d.tally
}

// serviceErrors returns the error lines of a service's log, for a report.
func serviceErrors(log string) string {
	var out []string
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, `"level":"ERROR"`) {
			out = append(out, line)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "\nservice errors:\n" + strings.Join(out[max(0, len(out)-5):], "\n")
}

// shrink shortens a failing sequence: it drops ever smaller runs of
// operations while a replay on a fresh service still fails, and cuts the
// sequence after the failing operation.
func shrink(t *testing.T, env func(*testing.T) map[string]string, ops []op, msg string) ([]op, string) {
	deadline := time.Now().Add(shrinkBudget)
	for chunk := len(ops) / 2; chunk >= 1 && time.Now().Before(deadline); {
		removed := false
		for start := 0; start < len(ops) && time.Now().Before(deadline); {
			cand := append(slices.Clone(ops[:start]), ops[min(start+chunk, len(ops)):]...)
			if _, at, m, _ := execute(t, env, len(cand), func(_ *model, i int) op { return cand[i] }); at >= 0 {
				ops, msg, removed = cand[:at+1], m, true
			} else {
				start += chunk
			}
		}
		if !removed || chunk > 1 {
			chunk /= 2
		}
	}
	return ops, msg
}

// heldToken is a token the driver created.
type heldToken struct{ id, secret string }

var createdToken = regexp.MustCompile(`created token (\S+) .*\n(rlt_\S+)`)

// tokenCommand creates or revokes a token with the command line, as an
// operator does beside the running service, and answers as the API would
// (201, 204, 404, 409), once the service honours the change: the secret
// works, or no longer does.
func (d *driver) tokenCommand(o *op) answer {
	var args []string
	switch o.kind {
	case opCreateToken:
		args = []string{"token", "create", "-name", "model-" + o.token, "-scope", "decide"}
	default:
		id := "no-such-token"
		if h, ok := d.tokens[o.token]; ok {
			id = h.id
		}
		args = []string{"token", "revoke", id}
	}
	db := []string{"-database-url", d.dbURL}
	if o.flagsLast {
		args = append(args, db...)
	} else {
		args = slices.Insert(args, 2, db...)
	}
	var out, log bytes.Buffer
	err := run(context.Background(), args, getenv(map[string]string{"RATELIMIT_LOG_LEVEL": "warn"}), &out, &log)
	switch {
	case errors.Is(err, limiter.ErrTokenExists):
		return answer{status: http.StatusConflict}
	case errors.Is(err, limiter.ErrTokenNotFound):
		return answer{status: http.StatusNotFound}
	case err != nil:
		return answer{status: -1, body: []byte(fmt.Sprintf("%q: %v\n%s", args, err, log.Bytes()))}
	}
	if o.kind == opCreateToken {
		m := createdToken.FindStringSubmatch(out.String())
		if m == nil {
			return answer{status: -1, body: out.Bytes()}
		}
		d.tokens[o.token] = heldToken{m[1], m[2]}
		return d.honoured(answer{status: http.StatusCreated}, m[2], http.StatusOK)
	}
	return d.honoured(answer{status: http.StatusNoContent}, d.tokens[o.token].secret, http.StatusUnauthorized)
}

// honoured returns a once the service answers whoami with the secret as
// want, within the few seconds the contract gives a change made beside
// it, and an error answer if it never does.
func (d *driver) honoured(a answer, secret string, want int) answer {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		req, err := http.NewRequest(http.MethodGet, d.url+"/v1/whoami", nil)
		if err != nil {
			d.t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+secret)
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == want {
				return a
			}
		}
		if time.Now().After(deadline) {
			return answer{status: -1, body: []byte(fmt.Sprintf("the change of the command line was not honoured within 5 s: whoami %v, %v", res.StatusCode, err))}
		}
	}
}

// driver sends operations to the service over HTTP.
type driver struct {
	t   *testing.T
	url string
	// dbURL is the service's database, which the command line writes to.
	dbURL  string
	clock  *testenv.Clock
	tokens map[string]heldToken
	// leases are the ids of the leases acquired, by label.
	leases map[string]string
	mu     sync.Mutex
	tally  map[int]int // answers by status
}

// call sends a request with the admin token unless secret is given.
func (d *driver) call(method, path, secret, contentType string, body []byte) answer {
	req, err := http.NewRequest(method, d.url+path, bytes.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if secret == "" {
		secret = bootstrap
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{status: -1, body: []byte(err.Error())}
	}
	d.mu.Lock()
	d.tally[res.StatusCode]++
	d.mu.Unlock()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return answer{status: -1, body: []byte(err.Error())}
	}
	return answer{status: res.StatusCode, body: b}
}

// json sends v as a JSON object whose strings reach the service as they
// are, bytes that are not UTF-8 included (see rawString).
func (d *driver) json(method, path string, v map[string]any) answer {
	var b bytes.Buffer
	b.WriteByte('{')
	keys := keyOrder(v)
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(rawString(k) + ":")
		if s, ok := v[k].(string); ok {
			b.WriteString(rawString(s))
			continue
		}
		j, err := json.Marshal(v[k])
		if err != nil {
			d.t.Fatal(err)
		}
		b.Write(j)
	}
	b.WriteByte('}')
	ctype := "application/json"
	if method == http.MethodPatch {
		ctype = "application/merge-patch+json"
	}
	a := d.call(method, path, "", ctype, b.Bytes())
	a.order = errorOrder(a, func(field string) int {
		// Fields the body lacks, and headers, come after those it has.
		if i := slices.Index(keys, field); i >= 0 {
			return i
		}
		return len(keys)
	})
	return a
}

// keyOrder is the order in which json writes the keys of v: shuffled by
// the keys themselves, so that bodies come in many orders while a replayed
// sequence sends the same bytes.
func keyOrder(v map[string]any) []string {
	keys := sortedKeys(v)
	h := fnv.New64a()
	for _, k := range keys {
		h.Write([]byte(k))
	}
	rand.New(rand.NewPCG(h.Sum64(), 0)).Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	return keys
}

// errorOrder checks that the field errors of a 400 or 422 come in the
// order their fields stand in the body, by rank: a description of the
// first that does not, else "".
func errorOrder(a answer, rank func(field string) int) string {
	if a.status != http.StatusBadRequest && a.status != http.StatusUnprocessableEntity {
		return ""
	}
	var p struct{ Errors []struct{ Field string } }
	if err := json.Unmarshal(a.body, &p); err != nil {
		return mismatchf("a %d that is no problem: %s", a.status, clip(a.body))
	}
	for i := 1; i < len(p.Errors); i++ {
		if rank(p.Errors[i].Field) < rank(p.Errors[i-1].Field) {
			return mismatchf("field errors out of body order: %s", clip(a.body))
		}
	}
	return ""
}

// bucketRank ranks the fields of a decision body as bucketsJSON writes
// them: the list, then each bucket, its limit, its bucket id and its cost.
func bucketRank(field string) int {
	if field == "buckets" {
		return 0
	}
	var i int
	if _, err := fmt.Sscanf(field, "buckets[%d]", &i); err != nil {
		return 1 << 30
	}
	_, key, _ := strings.Cut(field, "].")
	return 1 + 4*i + map[string]int{"": 0, "limit": 1, "bucket_id": 2, "cost": 3}[key]
}

func paramsJSON(p modelParams, into map[string]any) map[string]any {
	into["burst"], into["count"], into["period"] = p.Burst, p.Count, p.Period.String()
	return into
}

// overrideParamsJSON writes an override's parameters as its limit's kind
// takes them: a quota's have no period.
func overrideParamsJSON(limit string, p modelParams, into map[string]any) map[string]any {
	if slotNamed(limit).kind == kindQuota {
		into["burst"], into["count"] = p.Count, p.Count
		return into
	}
	return paramsJSON(p, into)
}

// overrideID finds the id of the override of limit for bucket id, in any
// notation, or returns one that names no override.
func (d *driver) overrideID(limit, id string) string {
	a := d.call(http.MethodGet, "/v1/overrides?limit="+url.QueryEscape(limit)+"&bucket_id="+url.QueryEscape(id), "", "", nil)
	var got struct{ Overrides []struct{ ID string } }
	if a.status == http.StatusOK && json.Unmarshal(a.body, &got) == nil && len(got.Overrides) == 1 {
		return got.Overrides[0].ID
	}
	return "no-such-override"
}

func (d *driver) do(o *op) answer {
	if o.cli {
		return d.tokenCommand(o)
	}
	switch o.kind {
	case opPutLimit:
		if o.ifExists && d.call(http.MethodGet, "/v1/limits/"+o.limit, "", "", nil).status == http.StatusNotFound {
			return answer{skipped: true}
		}
		if o.limitKind != "" {
			return d.json(http.MethodPut, "/v1/limits/"+o.limit, kindLimitJSON(o))
		}
		body := paramsJSON(o.params, map[string]any{"id_format": o.format})
		if o.bad {
			body["burst"] = 0
		}
		if o.enum > 0 {
			body["enum"] = o.enum
		}
		return d.json(http.MethodPut, "/v1/limits/"+o.limit, body)
	case opDeleteLimit:
		return d.call(http.MethodDelete, "/v1/limits/"+o.limit, "", "", nil)
	case opCreateOverride:
		body := map[string]any{"limit": o.limit, "bucket_id": o.id}
		if o.unlimited {
			body["unlimited"] = true
		} else {
			overrideParamsJSON(o.limit, o.params, body)
		}
		if o.comment != "" {
			body["comment"] = o.comment
		}
		if o.disable {
			body["enabled"] = false
		}
		if o.expiresIn > 0 {
			body["expires_at"] = d.clock.Now().Add(o.expiresIn).UTC().Format(time.RFC3339Nano)
		}
		return d.json(http.MethodPost, "/v1/overrides", body)
	case opPatchOverride:
		var body map[string]any
		switch o.patch {
		case "params":
			body = overrideParamsJSON(o.limit, o.params, map[string]any{"unlimited": false})
		case "unlimited":
			body = map[string]any{"unlimited": true}
		case "disable", "enable":
			body = map[string]any{"enabled": o.patch == "enable"}
		case "expire":
			body = map[string]any{"expires_at": d.clock.Now().Add(o.expiresIn).UTC().Format(time.RFC3339Nano)}
		case "noexpiry":
			body = map[string]any{"expires_at": nil}
		}
		return d.json(http.MethodPatch, "/v1/overrides/"+d.overrideID(o.limit, o.id), body)
	case opDeleteOverride:
		return d.call(http.MethodDelete, "/v1/overrides/"+d.overrideID(o.limit, o.id), "", "", nil)
	case opImportDefaults, opImportOverrides:
		kind, doc := importDoc(o)
		a := d.call(http.MethodPost, "/v1/import?kind="+kind+"&dry_run="+strconv.FormatBool(o.dryRun), "", "application/yaml", []byte(doc))
		if o.kind == opImportDefaults && a.status == http.StatusOK && !o.dryRun {
			a.listing = d.call(http.MethodGet, "/v1/limits", "", "", nil).body
		}
		return a
	case opCreateToken:
		a := d.json(http.MethodPost, "/v1/tokens", map[string]any{"name": "model-" + o.token, "scope": "decide"})
		var got struct{ ID, Token string }
		if a.status == http.StatusCreated && json.Unmarshal(a.body, &got) == nil {
			d.tokens[o.token] = heldToken{got.ID, got.Token}
		}
		return a
	case opRevokeToken:
		id := "no-such-token"
		if h, ok := d.tokens[o.token]; ok {
			id = h.id
		}
		return d.call(http.MethodDelete, "/v1/tokens/"+id, "", "", nil)
	case opCheck, opSpend, opRefund:
		secret := ""
		if o.token != "" {
			secret = "rlt_no-such-token"
			if h, ok := d.tokens[o.token]; ok {
				secret = h.secret
			}
		}
		path := map[opKind]string{opCheck: "/v1/check", opSpend: "/v1/spend", opRefund: "/v1/refund"}[o.kind]
		a := d.call(http.MethodPost, path, secret, "application/json", bucketsJSON(o.buckets, true))
		a.order = errorOrder(a, bucketRank)
		return a
	case opReset:
		a := d.call(http.MethodPost, "/v1/buckets/reset", "", "application/json", bucketsJSON(o.buckets, false))
		a.order = errorOrder(a, bucketRank)
		return a
	case opClock:
		d.clock.Advance(o.step)
		return answer{}
	case opRace:
		var wg sync.WaitGroup
		answers := make([]answer, len(o.race))
		for i := range o.race {
			wg.Go(func() { answers[i] = d.do(&o.race[i]) })
		}
		wg.Wait()
		return answer{race: answers}
	case opMany:
		return d.doMany(o)
	}
	return d.doKinds(o)
}

// bucketsJSON writes a decision body by hand, so that bucket ids that are
// not UTF-8 reach the service as they are: encoding/json would replace
// their bytes.
func bucketsJSON(buckets []bucketOp, cost bool) []byte {
	var b strings.Builder
	b.WriteString(`{"buckets":[`)
	for i, x := range buckets {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"limit":%s,"bucket_id":%s`, rawString(x.limit), rawString(x.id))
		if cost {
			fmt.Fprintf(&b, `,"cost":%d`, x.cost)
		}
		b.WriteByte('}')
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// rawString quotes s as a JSON string, escaping only what JSON requires.
func rawString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			fmt.Fprintf(&b, `\u%04x`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
