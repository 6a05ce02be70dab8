package main

import (
	"encoding/json"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// The reference model of concurrency limits (leases) and calendar quotas,
// written from the contract's sections "Concurrency limits: leases" and
// "Calendar quotas": what each bucket holds, which leases live, and what a
// window has used, with windows computed here from the zone database.

// The kinds of the test's slots.
const (
	kindRate        = "rate"
	kindConcurrency = "concurrency"
	kindQuota       = "quota"
)

// hostZones are zone names of hosts' zone directories that the IANA
// database lacks: refused, whatever the host holds.
var hostZones = []string{"localtime", "posixrules", "right/UTC", "right/Europe/Paris"}

// quotaZones are the zones the generator gives quotas: one with a
// daylight-saving change of an hour, one across the Atlantic, one whose
// offset is not whole hours, and UTC.
var quotaZones = []string{"Europe/Paris", "Europe/Paris", "America/New_York", "America/New_York", "Asia/Kolkata", "UTC"}

// quotaCalendars repeats day, which a daylight-saving change shows.
var quotaCalendars = []string{"hour", "day", "day", "day", "week", "month", "year"}

// modelWindow returns the window of calendar c in zone that holds now (µs):
// its start and end in µs. Hours are the real hours whose local minute is
// 0; the other windows start at local midnight of their first day.
func modelWindow(c, zone string, now int64) (int64, int64) {
	loc, msg := limiter.LoadZone(zone)
	if msg != "" {
		panic(msg)
	}
	t := time.UnixMicro(now).In(loc)
	if c == "hour" {
		start := t.Add(-time.Duration(t.Minute())*time.Minute - time.Duration(t.Second())*time.Second - time.Duration(t.Nanosecond()))
		return start.UnixMicro(), start.Add(time.Hour).UnixMicro()
	}
	y, mo, d := t.Date()
	var from, to time.Time
	switch c {
	case "day":
		from, to = time.Date(y, mo, d, 0, 0, 0, 0, loc), time.Date(y, mo, d+1, 0, 0, 0, 0, loc)
	case "week":
		back := (int(t.Weekday()) + 6) % 7
		from, to = time.Date(y, mo, d-back, 0, 0, 0, 0, loc), time.Date(y, mo, d-back+7, 0, 0, 0, 0, loc)
	case "month":
		from, to = time.Date(y, mo, 1, 0, 0, 0, 0, loc), time.Date(y, mo+1, 1, 0, 0, 0, 0, loc)
	default:
		from, to = time.Date(y, 1, 1, 0, 0, 0, 0, loc), time.Date(y+1, 1, 1, 0, 0, 0, 0, loc)
	}
	return from.UnixMicro(), to.UnixMicro()
}

// quotaUse is what a quota bucket used in the window that ends at end.
type quotaUse struct {
	end, used int64
}

// modelLease is a lease the model knows by its label. holds are the
// buckets it holds units of, and how many; a reset of a bucket takes it
// out of holds, while the lease lives on until it expires or is released.
type modelLease struct {
	holds    map[bucketKey]int64
	expires  int64 // µs
	maxTTL   int64 // µs
	released bool
}

func (l *modelLease) live(now int64) bool { return !l.released && l.expires > now }

// held returns what bucket k holds at now, and the expiries of its
// earliest- and latest-ending live leases.
func (m *model) held(k bucketKey) (held, earliest, latest int64) {
	for _, l := range m.leases {
		if c, ok := l.holds[k]; ok && l.live(m.now) {
			held += c
			if earliest == 0 || l.expires < earliest {
				earliest = l.expires
			}
			latest = max(latest, l.expires)
		}
	}
	return held, earliest, latest
}

// leaseOutcome is the contract's answer for a bucket of an acquire, or of
// a check of a concurrency bucket: allowed iff it holds at most burst -
// cost units.
func (m *model) leaseOutcome(k bucketKey, p modelParams, cost int64) outcome {
	held, earliest, latest := m.held(k)
	out := outcome{held: held, remaining: max(p.Burst-held, 0), resetMS: (max(latest, m.now) - m.now) / 1000,
		checkAllow: true, checkRest: true, checkHeld: true, checkReset: true, checkRetry: true}
	switch {
	case p.Burst == 0 && cost > 0:
		// Nothing of a blocked bucket is read: its answer says no more.
		out = outcome{reason: "blocked", retryMS: -1, checkAllow: true, checkRest: true, checkRetry: true}
	case cost > p.Burst:
		out.reason, out.retryMS = "cost_exceeds_burst", -1
	case held+cost > p.Burst:
		out.reason, out.retryMS = "limited", (earliest-m.now)/1000
	default:
		out.allowed = true
	}
	return out
}

// quotaOutcome is the contract's step of a spend or check (refund false)
// or a refund of cost on a quota bucket: the use to keep and the outcome.
func (m *model) quotaOutcome(r resolved, cost int64, refund bool) (quotaUse, outcome) {
	_, end := modelWindow(r.limit.calendar, r.limit.zone, m.now)
	use := m.quota[r.key]
	if use.end != end {
		use = quotaUse{end: end}
	}
	count := r.params.Count
	out := outcome{checkAllow: true, checkRest: true, checkReset: true, resetMS: (end - m.now) / 1000}
	if count == 0 && !refund {
		// An override of count 0 blocks the bucket: cost 0 still inspects.
		out.allowed = cost == 0
		if cost > 0 {
			out.reason, out.retryMS, out.checkRetry = "blocked", -1, true
		}
		return use, out
	}
	if refund {
		out.checkAllow = count > 0
		if cost > 0 && use.used > 0 && count > 0 {
			use.used = max(use.used-cost, 0)
			out.allowed = true
		}
		out.remaining = max(count-use.used, 0)
		return use, out
	}
	out.checkRetry = true
	out.remaining = max(count-use.used, 0)
	switch {
	case cost > count:
		out.reason, out.retryMS = "cost_exceeds_burst", -1
	case use.used+cost > count:
		out.reason, out.retryMS = "limited", (end-m.now)/1000
	default:
		out.allowed = true
		use.used += cost
		out.remaining = count - use.used
	}
	return use, out
}

// --- generation ---

// kindParams picks parameters for a limit or override of kind.
func (g *generator) kindParams(kind string, blockable bool) modelParams {
	switch kind {
	case kindConcurrency:
		b := pick(g.r, []int64{1, 2, 3, 5})
		p := modelParams{Burst: b, Count: b, Period: pick(g.r, []time.Duration{time.Second, 10 * time.Second, time.Minute})}
		if blockable && g.r.IntN(8) == 0 {
			p.Burst, p.Count = 0, 0
		}
		return p
	case kindQuota:
		c := pick(g.r, []int64{1, 2, 3, 5, 10})
		if blockable && g.r.IntN(8) == 0 {
			c = 0
		}
		return modelParams{Burst: c, Count: c}
	}
	return g.params(blockable)
}

// putKindLimit makes a PUT of a concurrency limit or quota: mostly
// valid, sometimes a change of kind or a body the contract refuses.
func (g *generator) putKindLimit(s slot) op {
	o := op{kind: opPutLimit, limit: s.name, format: s.formats[0], limitKind: s.kind, params: g.kindParams(s.kind, false)}
	if s.kind == kindQuota {
		o.calendar, o.zone = pick(g.r, quotaCalendars), pick(g.r, quotaZones)
		if l := g.m.limits[s.name]; l != nil && g.r.IntN(3) > 0 {
			o.calendar, o.zone = l.calendar, l.zone // a change of count only
		}
	}
	switch n := g.r.IntN(12); {
	case n == 0 && g.m.limits[s.name] != nil:
		// A change of kind: refused while the limit exists. A shortened
		// sequence may have dropped the limit's creation; then the
		// driver sends nothing, so that no limit takes another kind
		// than its slot's.
		o.ifExists = true
		o.limitKind = map[string]string{kindConcurrency: kindRate, kindQuota: kindConcurrency}[s.kind]
		o.params = g.kindParams(o.limitKind, false)
		o.calendar, o.zone = "", ""
	case n == 1:
		o.badField = pick(g.r, map[string][]string{
			kindConcurrency: {"count", "period", "calendar", "period_long"},
			kindQuota:       {"period", "burst", "time_zone", "time_zone_path", "time_zone_local", "time_zone_host", "calendar"},
		}[s.kind])
		if o.badField == "time_zone_host" {
			o.zone = pick(g.r, hostZones)
		}
	}
	return o
}

// acquire makes an acquire of one or two buckets, mostly of the
// concurrency slot, with a ttl that is mostly left out or valid.
func (g *generator) acquire() op {
	calls := slotNamed("Calls")
	o := op{kind: opAcquire, lease: "l" + strconv.Itoa(g.m.acquires), ttlMS: -1}
	o.buckets = []bucketOp{g.leaseBucket(calls)}
	if g.r.IntN(4) == 0 {
		o.buckets = append(o.buckets, g.leaseBucket(calls))
	}
	if g.r.IntN(15) == 0 {
		o.buckets = append(o.buckets, g.bucket(g.slot())) // mostly not a concurrency limit
	}
	if g.r.IntN(3) == 0 {
		o.ttlMS = pick(g.r, []int64{500, 1000, 2500, 10000, 60000, 60001, 0, -5, 1 << 40})
	}
	return o
}

func (g *generator) leaseBucket(s slot) bucketOp {
	return bucketOp{limit: s.name, id: pick(g.r, s.ids), cost: pick(g.r, []int64{1, 1, 1, 2, 3, 6, 0, -1})}
}

// leaseLabel picks a lease the run acquired, or one it never did.
func (g *generator) leaseLabel() string {
	if g.m.acquires > 0 && g.r.IntN(10) < 9 {
		return "l" + strconv.Itoa(g.r.IntN(g.m.acquires))
	}
	return "never"
}

// jump moves the clock to just before a boundary that quotas care about,
// in the zone of the quota slot's limit (Paris when it has none): the end
// of its current window, a daylight-saving change, the end of a month, or
// 29 February.
func (g *generator) jump() op {
	now := time.UnixMicro(g.m.now)
	calendar, zone := "day", "Europe/Paris"
	if l := g.m.limits["Quota"]; l != nil && l.kind == kindQuota {
		calendar, zone = l.calendar, l.zone
	}
	loc, _ := limiter.LoadZone(zone)
	var target time.Time
	switch g.r.IntN(4) {
	case 0:
		_, end := modelWindow(calendar, zone, g.m.now)
		target = time.UnixMicro(end).Add(-time.Second)
	case 1:
		target = nextOffsetChange(now, loc).Add(-2 * time.Second)
	case 2:
		t := now.In(loc)
		target = time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, loc).Add(-time.Millisecond)
	default:
		y := now.Year() + 1
		for y%4 != 0 || y%100 == 0 && y%400 != 0 {
			y++
		}
		target = time.Date(y, 2, 29, 23, 59, 59, 0, loc)
	}
	if !target.After(now) {
		return op{kind: opClock, step: time.Second}
	}
	return op{kind: opClock, step: target.Sub(now).Truncate(time.Millisecond)}
}

// nextOffsetChange finds the next instant after t at which loc's offset
// changes: a week at a time, then by halving; a year ahead for a zone
// that keeps its offset.
func nextOffsetChange(t time.Time, loc *time.Location) time.Time {
	_, off := t.In(loc).Zone()
	lo := t
	for range 53 {
		hi := lo.Add(7 * 24 * time.Hour)
		if _, o := hi.In(loc).Zone(); o != off {
			for hi.Sub(lo) > time.Second {
				mid := lo.Add(hi.Sub(lo) / 2)
				if _, o := mid.In(loc).Zone(); o == off {
					lo = mid
				} else {
					hi = mid
				}
			}
			return hi.Truncate(time.Second)
		}
		lo = hi
	}
	return lo
}

// nextKinds draws one of the operations of leases and quotas, or reports
// false to leave the draw to the rest of the generator.
func (g *generator) nextKinds() (op, bool) {
	switch n := g.r.IntN(100); {
	case n < 8:
		return g.acquire(), true
	case n < 12:
		return op{kind: opRelease, lease: g.leaseLabel()}, true
	case n < 15:
		o := op{kind: opRenew, lease: g.leaseLabel(), ttlMS: -1}
		if g.r.IntN(2) == 0 {
			o.ttlMS = pick(g.r, []int64{500, 1000, 10000, 60001, 0})
		}
		return o, true
	case n < 16:
		return op{kind: opRelease, lease: "malformed"}, true
	case n < 19:
		return g.jump(), true
	case n < 25:
		o := g.decision(pick(g.r, []opKind{opSpend, opSpend, opCheck, opRefund}))
		o.buckets[0] = g.bucket(slotNamed("Quota"))
		return o, true
	case n < 28:
		return g.putKindLimit(slotNamed(pick(g.r, []string{"Calls", "Quota"}))), true
	}
	return op{}, false
}

// --- driving ---

// acquireJSON writes the body of an acquire.
func acquireJSON(o *op) []byte {
	b := bucketsJSON(o.buckets, true)
	if o.ttlMS == -1 {
		return b
	}
	return append(b[:len(b)-1], []byte(`,"ttl_ms":`+strconv.FormatInt(o.ttlMS, 10)+`}`)...)
}

// leaseID is the id the service gave the lease of label, or a well-formed
// id it never gave.
func (d *driver) leaseID(label string) string {
	switch {
	case label == "malformed":
		return "lse_../../etc/passwd"
	case d.leases[label] != "":
		return d.leases[label]
	}
	return "lse_aaaaaaaaaaaaaaaaaaaaaaaaaa"
}

func (d *driver) doKinds(o *op) answer {
	switch o.kind {
	case opAcquire:
		a := d.call(http.MethodPost, "/v1/acquire", "", "application/json", acquireJSON(o))
		var got struct{ Lease *struct{ ID string } }
		if a.status == http.StatusOK && json.Unmarshal(a.body, &got) == nil && got.Lease != nil {
			d.leases[o.lease] = got.Lease.ID
		}
		return a
	case opRelease:
		return d.json(http.MethodPost, "/v1/release", map[string]any{"lease_id": d.leaseID(o.lease)})
	case opRenew:
		body := map[string]any{"lease_id": d.leaseID(o.lease)}
		if o.ttlMS != -1 {
			body["ttl_ms"] = o.ttlMS
		}
		return d.json(http.MethodPost, "/v1/renew", body)
	}
	d.t.Fatalf("unknown operation %d", o.kind)
	return answer{}
}

// kindLimitJSON is the body of a PUT of a concurrency limit or quota.
func kindLimitJSON(o *op) map[string]any {
	body := map[string]any{"id_format": o.format, "kind": o.limitKind}
	switch o.limitKind {
	case kindQuota:
		body["kind"] = kindRate
		body["burst"], body["count"] = o.params.Count, o.params.Count
		body["calendar"], body["time_zone"] = o.calendar, o.zone
	default:
		paramsJSON(o.params, body)
	}
	switch o.badField {
	case "count":
		body["count"] = o.params.Burst + 1
	case "period":
		body["period"] = "500ms"
	case "period_long":
		body["period"] = "25h"
	case "calendar":
		body["calendar"] = "fortnight"
		if o.limitKind == kindConcurrency {
			body["calendar"] = "day"
		}
	case "burst":
		body["burst"] = o.params.Count + 1
	case "time_zone":
		body["time_zone"] = "Mars/Olympus_Mons"
	case "time_zone_path":
		body["time_zone"] = "../../etc/passwd"
	case "time_zone_local":
		body["time_zone"] = "Local"
	}
	return body
}

// --- the model's side ---

// putKindLimit: PUT /v1/limits/{name} of a concurrency limit or quota.
func (m *model) putKindLimit(o *op, a answer) string {
	old := m.limits[o.limit]
	if o.ifExists && old == nil {
		if !a.skipped {
			return mismatchf("a change of kind of no limit was sent")
		}
		return ""
	}
	if strings.HasPrefix(o.badField, "time_zone") {
		return expectFields(a, "time_zone")
	}
	if o.badField != "" {
		return expectStatus(a, 422)
	}
	if old != nil && old.kind != o.limitKind {
		return expectStatus(a, 409)
	}
	if old == nil {
		if s := expectStatus(a, 201); s != "" {
			return s
		}
		var got struct{ Enum int }
		if err := json.Unmarshal(a.body, &got); err != nil {
			return mismatchf("body %s: %v", clip(a.body), err)
		}
		m.enums[got.Enum] = true
		m.gens++
		m.limits[o.limit] = &modelLimit{format: o.format, params: o.params, enum: got.Enum, gen: m.gens,
			kind: o.limitKind, calendar: o.calendar, zone: o.zone}
		return ""
	}
	if s := expectStatus(a, 200); s != "" {
		return s
	}
	if old.calendar != o.calendar || old.zone != o.zone {
		// Other windows: the quota's usage starts again.
		m.gens++
		old.gen = m.gens
	}
	old.params, old.calendar, old.zone = o.params, o.calendar, o.zone
	return ""
}

// acquire: POST /v1/acquire.
func (m *model) acquire(o *op, a answer) string {
	m.acquires++
	rs := make([]resolved, len(o.buckets))
	status := 0
	seen := map[bucketKey]bool{}
	for i, b := range o.buckets {
		r, _, bad := m.resolve(b)
		switch {
		case bad == 400 || status == 400:
			status = 400
		case bad != 0 || b.cost < 1 || r.limit.kind != kindConcurrency || seen[r.key]:
			status = 422
		}
		seen[r.key] = true
		rs[i] = r
	}
	maxTTL := int64(0)
	if status == 0 {
		maxTTL = m.leaseMaxTTL(rs)
		if o.ttlMS != -1 && (o.ttlMS < 1 || o.ttlMS*1000 > maxTTL) {
			status = 422
		}
	}
	if status != 0 {
		return expectStatus(a, status)
	}
	if s := expectStatus(a, 200); s != "" {
		return s
	}
	ttl := maxTTL
	if o.ttlMS != -1 {
		ttl = o.ttlMS * 1000
	}
	outs := make([]outcome, len(rs))
	allowed := true
	for i, r := range rs {
		if r.source == "unlimited" {
			outs[i] = outcome{allowed: true, checkAllow: true}
		} else {
			outs[i] = m.leaseOutcome(r.key, r.params, o.buckets[i].cost)
		}
		outs[i].source = r.source
		allowed = allowed && outs[i].allowed
	}
	var got struct {
		Lease *struct {
			ID        string
			ExpiresAt time.Time `json:"expires_at"`
		}
	}
	if err := json.Unmarshal(a.body, &got); err != nil {
		return mismatchf("acquire body %s: %v", clip(a.body), err)
	}
	if allowed != (got.Lease != nil) {
		return mismatchf("lease %v, want one: %v; body %s", got.Lease != nil, allowed, clip(a.body))
	}
	if allowed {
		l := &modelLease{holds: map[bucketKey]int64{}, expires: m.now + ttl, maxTTL: maxTTL}
		for i, r := range rs {
			if r.source != "unlimited" {
				l.holds[r.key] = o.buckets[i].cost
				outs[i].held += o.buckets[i].cost
				outs[i].remaining -= o.buckets[i].cost
				outs[i].resetMS = (max(l.expires, m.now+outs[i].resetMS*1000) - m.now) / 1000
			}
		}
		if !got.Lease.ExpiresAt.Equal(time.UnixMicro(l.expires)) {
			return mismatchf("lease expires at %s, want %s", got.Lease.ExpiresAt, time.UnixMicro(l.expires).UTC())
		}
		m.leases[o.lease] = l
	}
	return compareDecisions(a.body, true, allowed, outs)
}

// leaseMaxTTL is the longest a lease of the resolved buckets may live:
// the shortest period in force (an unlimited bucket's limit's own).
func (m *model) leaseMaxTTL(rs []resolved) int64 {
	ttl := int64(24 * time.Hour / time.Microsecond)
	for _, r := range rs {
		p := r.params
		if r.source == "unlimited" {
			p = r.limit.params
		}
		ttl = min(ttl, p.Period.Microseconds())
	}
	return ttl
}

// release: POST /v1/release.
func (m *model) release(o *op, a answer) string {
	if o.lease == "malformed" {
		return expectStatus(a, 422)
	}
	if s := expectStatus(a, 200); s != "" {
		return s
	}
	l := m.leases[o.lease]
	want := l != nil && l.live(m.now)
	var got struct{ Released bool }
	if err := json.Unmarshal(a.body, &got); err != nil || got.Released != want {
		return mismatchf("released %v, want %v; body %s", got.Released, want, clip(a.body))
	}
	if want {
		l.released = true
	}
	return ""
}

// renew: POST /v1/renew.
func (m *model) renew(o *op, a answer) string {
	l := m.leases[o.lease]
	switch {
	case o.ttlMS == 0:
		return expectStatus(a, 422)
	case l == nil || !l.live(m.now):
		return expectStatus(a, 404)
	case o.ttlMS != -1 && o.ttlMS*1000 > l.maxTTL:
		return expectStatus(a, 422)
	}
	if s := expectStatus(a, 200); s != "" {
		return s
	}
	ttl := l.maxTTL
	if o.ttlMS != -1 {
		ttl = o.ttlMS * 1000
	}
	l.expires = m.now + ttl
	var got struct {
		Lease struct {
			ExpiresAt time.Time `json:"expires_at"`
		}
	}
	if err := json.Unmarshal(a.body, &got); err != nil || !got.Lease.ExpiresAt.Equal(time.UnixMicro(l.expires)) {
		return mismatchf("renewed to %s, want %s (%v)", got.Lease.ExpiresAt, time.UnixMicro(l.expires).UTC(), err)
	}
	return ""
}

// resetLeases takes bucket k out of every lease: its units are free.
func (m *model) resetLeases(k bucketKey) {
	for _, l := range m.leases {
		delete(l.holds, k)
	}
}

// cloneKinds copies the model's leases and quota uses into c.
func (m *model) cloneKinds(c *model) {
	c.leases = make(map[string]*modelLease, len(m.leases))
	for k, v := range m.leases {
		l := *v
		l.holds = maps.Clone(v.holds)
		c.leases[k] = &l
	}
	c.quota = maps.Clone(m.quota)
}
