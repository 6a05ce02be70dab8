package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The requests of POST /v1/decisions in TestModel: an opMany holds
// operations of buckets and leases, sent together, and the model checks
// each one's result as the answer of its own route, one after the other.

// nextMany draws a request of many decisions, or reports false to leave
// the draw to the rest of the generator.
func (g *generator) nextMany() (op, bool) {
	if g.r.IntN(100) >= 6 {
		return op{}, false
	}
	o := op{kind: opMany}
	acquires := 0
	for range 1 + g.r.IntN(8) {
		var sub op
		switch n := g.r.IntN(20); {
		case n < 7:
			sub = g.decision(opSpend)
		case n < 10:
			sub = g.decision(opCheck)
		case n < 12:
			sub = g.decision(opRefund)
		case n < 14:
			// A bucket spent twice in one request sees the first spend.
			if len(o.many) > 0 && o.many[len(o.many)-1].kind == opSpend {
				sub = o.many[len(o.many)-1]
			} else {
				sub = g.decision(opSpend)
			}
		case n < 16:
			// The lease of the k-th acquire of the request gets the
			// label the model gives it then.
			sub = g.acquire()
			sub.lease = "l" + strconv.Itoa(g.m.acquires+acquires)
			acquires++
		case n < 18:
			sub = op{kind: opRelease, lease: g.leaseLabel()}
		default:
			sub = op{kind: opRenew, lease: g.leaseLabel(), ttlMS: -1}
			if g.r.IntN(2) == 0 {
				sub.ttlMS = pick(g.r, []int64{500, 10000, 60001, 0})
			}
		}
		o.many = append(o.many, sub)
	}
	return o, true
}

// manyString lists the operations of an opMany.
func manyString(o *op) string {
	parts := make([]string, len(o.many))
	for i := range o.many {
		parts[i] = o.many[i].String()
	}
	return "decisions: [" + strings.Join(parts, " | ") + "]"
}

// opNames are the ops of /v1/decisions by the model's operations.
var opNames = map[opKind]string{opCheck: "check", opSpend: "spend", opRefund: "refund", opAcquire: "acquire", opRelease: "release", opRenew: "renew"}

// manyJSON writes the body of an opMany by hand, as bucketsJSON does, each
// request's op first or last in turn, so that both orders are read.
func (d *driver) manyJSON(o *op) []byte {
	var b strings.Builder
	b.WriteString(`{"requests":[`)
	for i := range o.many {
		sub := &o.many[i]
		var body []byte
		switch sub.kind {
		case opAcquire:
			body = acquireJSON(sub)
		case opRelease, opRenew:
			body = []byte(`{"lease_id":` + rawString(d.leaseID(sub.lease)))
			if sub.kind == opRenew && sub.ttlMS != -1 {
				body = append(body, `,"ttl_ms":`+strconv.FormatInt(sub.ttlMS, 10)...)
			}
			body = append(body, '}')
		default:
			body = bucketsJSON(sub.buckets, true)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		name := `"op":"` + opNames[sub.kind] + `"`
		if i%2 == 0 {
			b.WriteString("{" + name + "," + string(body[1:]))
		} else {
			b.WriteString(string(body[:len(body)-1]) + "," + name + "}")
		}
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// doMany sends an opMany and splits its answer into one per request: a
// result is its route's 200, a problem its route's problem, with the
// status inside.
func (d *driver) doMany(o *op) answer {
	a := d.call(http.MethodPost, "/v1/decisions", "", "application/json", d.manyJSON(o))
	if a.status != http.StatusOK {
		return a
	}
	var got struct{ Results []json.RawMessage }
	if err := json.Unmarshal(a.body, &got); err != nil || len(got.Results) != len(o.many) {
		a.order = mismatchf("%d requests answered %s (%v)", len(o.many), clip(a.body), err)
		return a
	}
	for i, raw := range got.Results {
		sub := answer{status: http.StatusOK, body: raw}
		var p struct{ Problem *struct{ Status int } }
		if err := json.Unmarshal(raw, &p); err == nil && p.Problem != nil {
			var inner struct{ Problem json.RawMessage }
			_ = json.Unmarshal(raw, &inner)
			sub = answer{status: p.Problem.Status, body: inner.Problem}
		}
		switch o.many[i].kind {
		case opAcquire:
			var l struct{ Lease *struct{ ID string } }
			if sub.status == http.StatusOK && json.Unmarshal(raw, &l) == nil && l.Lease != nil {
				d.leases[o.many[i].lease] = l.Lease.ID
			}
			sub.order = errorOrder(sub, bucketRank)
		case opCheck, opSpend, opRefund:
			sub.order = errorOrder(sub, bucketRank)
		}
		a.many = append(a.many, sub)
	}
	return a
}

// many: POST /v1/decisions. A body that is not UTF-8 is refused as a
// whole; otherwise each request is answered as its route would answer
// it, in order.
func (m *model) many(o *op, a answer) string {
	for _, sub := range o.many {
		for _, b := range sub.buckets {
			if !utf8.ValidString(b.id) {
				return expectStatus(a, http.StatusBadRequest)
			}
		}
	}
	if s := expectStatus(a, http.StatusOK); s != "" {
		return s
	}
	for i := range o.many {
		sub := a.many[i]
		msg := sub.order
		if msg == "" {
			msg = m.apply(&o.many[i], sub)
		}
		if msg != "" {
			return fmt.Sprintf("request %d (%s): %s", i, o.many[i].String(), msg)
		}
	}
	return ""
}
