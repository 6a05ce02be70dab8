package decide

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// maxRequests is the most requests one body of /v1/decisions holds.
const maxRequests = 1000

// ops are the operations a request of /v1/decisions names.
var ops = map[string]limiter.Op{
	"check": limiter.Check, "spend": limiter.Spend, "refund": limiter.Refund, "settle": limiter.Settle,
	"acquire": limiter.Acquire, "release": limiter.Release, "renew": limiter.Renew,
}

const (
	opProblem       = "must be one of check, spend, refund, settle, acquire, release or renew"
	requestsProblem = "must hold 1 to 1000 requests"
)

// decisions answers many independent requests in one exchange, each as
// its own route would answer it, in their order: its answer, or
// {"problem": ...} with the problem its route would give, status and
// field names as there. A body that is not JSON, or not a list of
// requests, is the whole call's problem; a request that is not its
// route's body is its own. The Limiter decides them all in one call, so
// that a remote store needs one round trip for all of them.
func (h *Handler) decisions(w http.ResponseWriter, r *http.Request, sc *scratch) error {
	if err := readBody(r, sc); err != nil {
		return err
	}
	if !decodeManyFast(sc.body, sc) {
		if err := h.decodeManyStrict(sc); err != nil {
			return err
		}
	}
	start := 0
	for i, end := range sc.ends {
		sc.calls[i].Requests = sc.reqs[start:end:end]
		start = end
	}
	sc.decisions = h.cfg.Limiter.DecideMany(r.Context(), sc.calls, sc.decisions)
	b := append(sc.out, `{"results":[`...)
	for i, k := range sc.slots {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if k < 0 {
			b, err = appendProblem(sc, b, sc.refused[-1-k])
		} else {
			b, err = h.appendResult(sc, b, &sc.calls[k])
		}
		if err != nil {
			return err
		}
	}
	sc.out = append(b, "]}\n"...)
	// Past 2 KiB net/http would chunk the answer, which costs a write
	// of its own at the end; with its length it is sent in one or two.
	w.Header()["Content-Length"] = []string{strconv.Itoa(len(sc.out))}
	sc.answer(w)
	return nil
}

// appendResult appends the answer of a decided request to b: what its
// route answers, or its problem.
func (h *Handler) appendResult(sc *scratch, b []byte, c *limiter.Call) ([]byte, error) {
	err := c.Err
	switch c.Op {
	case limiter.Check, limiter.Spend, limiter.Refund, limiter.Settle:
		if err == nil {
			return h.appendDecision(sc, b, c.Op, c.Requests, c.Result), nil
		}
	case limiter.Acquire:
		if err == nil {
			return h.appendAcquired(sc, b, limiter.LeaseResult{Result: c.Result, Lease: c.Lease}), nil
		}
	case limiter.Release:
		var out []byte
		if out, err = h.appendReleased(b, c.Released, err); err == nil {
			return out, nil
		}
	case limiter.Renew:
		var l limiter.Lease
		if c.Lease != nil {
			l = *c.Lease
		}
		var out []byte
		if out, err = h.appendRenewed(sc, b, c.LeaseID, c.TTL, l, err); err == nil {
			return out, nil
		}
	}
	return appendProblem(sc, b, err)
}

// appendProblem appends {"problem": ...} with the problem of err to b, as
// the request's route would word it, with the call's request id. An error
// no route words is a bug of ours: it is returned, for the edge to answer
// the whole call with a 500 and log.
func appendProblem(sc *scratch, b []byte, err error) ([]byte, error) {
	p := &problem.Problem{RequestID: sc.x.RequestID()}
	body, ok := problem.From(err, p)
	if !ok {
		return b, err
	}
	problem.Complete(p)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(body); err != nil {
		return b, err
	}
	b = append(b, `{"problem":`...)
	b = append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
	return append(b, '}'), nil
}

// decodeManyFast reads the common form of a body of /v1/decisions into
// sc.calls, sc.ends and sc.reqs:
//
//	{"requests": [{"op": "spend", "buckets": [...]}, ...]}
//
// with 1 to maxRequests requests, each a check, spend, refund or settle
// whose buckets decodeFast takes. It reports false for anything else,
// valid or not, and decodeManyStrict then reads the body; the fuzz test
// holds the two to the same requests.
func decodeManyFast(body []byte, sc *scratch) bool {
	p := jsonScanner{b: body}
	if !p.next('{') || !p.key("requests") || !p.next('[') {
		return false
	}
	for {
		if len(sc.calls) == maxRequests || !p.next('{') {
			return false
		}
		op, ok := p.request(sc)
		if !ok {
			return false
		}
		sc.slots = append(sc.slots, len(sc.calls))
		sc.calls = append(sc.calls, limiter.Call{Op: op})
		sc.ends = append(sc.ends, len(sc.reqs))
		if p.next(',') {
			continue
		}
		return p.next(']') && p.end()
	}
}

// request consumes the members of a request after its opening brace, op
// and buckets in either order (generated clients write them in either),
// appending its buckets to sc.reqs.
func (p *jsonScanner) request(sc *scratch) (limiter.Op, bool) {
	var (
		op             limiter.Op
		any, all       uint8
		named, buckets bool
	)
	for {
		k, ok := p.str()
		if !ok || !p.next(':') {
			return op, false
		}
		switch string(k) {
		case "op":
			name, ok := p.str()
			if !ok || named {
				return op, false
			}
			op, named = ops[string(name)], true
		case "buckets":
			if buckets {
				return op, false
			}
			if sc.reqs, any, all, ok = p.buckets(sc.reqs, sc); !ok {
				return op, false
			}
			buckets = true
		default:
			return op, false
		}
		if p.next(',') {
			continue
		}
		return op, p.next('}') && buckets && op.Decides() && formOf(op).fits(any, all)
	}
}

// decodeManyStrict reads any body of /v1/decisions: each request as its
// route reads its body, so that a request its route would refuse is
// refused with that route's problem (sc.refused), and the others go to
// sc.calls. A body that is not JSON, not UTF-8, repeats a key anywhere,
// or is not an object of 1 to maxRequests requests is refused as a whole.
func (h *Handler) decodeManyStrict(sc *scratch) error {
	sc.calls, sc.ends, sc.slots, sc.reqs = sc.calls[:0], sc.ends[:0], sc.slots[:0], sc.reqs[:0]
	b, err := input.Parse(sc.body)
	if err != nil {
		return err
	}
	o := b.Root()
	o.Require("requests")
	items, n, ok := o.Values("requests", maxRequests)
	if ok && (n == 0 || n > maxRequests) {
		b.Errs.Add("requests", requestsProblem)
	}
	if err := b.Err(); err != nil {
		return err
	}
	for _, raw := range items {
		c, err := h.readRequest(raw, sc)
		if err != nil {
			sc.slots = append(sc.slots, -1-len(sc.refused))
			sc.refused = append(sc.refused, err)
			continue
		}
		sc.slots = append(sc.slots, len(sc.calls))
		sc.calls = append(sc.calls, c)
		sc.ends = append(sc.ends, len(sc.reqs))
	}
	return nil
}

// readRequest reads one request of a body of /v1/decisions, which parsed
// already, as its route reads its body, appending its buckets to
// sc.reqs. A request whose op is missing, of the wrong type or unknown is
// refused naming op alone: its other fields mean nothing without it.
func (h *Handler) readRequest(raw []byte, sc *scratch) (limiter.Call, error) {
	b, err := input.Parse(raw)
	if err != nil {
		return limiter.Call{}, err
	}
	o := b.Root()
	if raw[0] != '{' {
		return limiter.Call{}, b.Shape()
	}
	if !o.Has("op") {
		return limiter.Call{}, &limiter.ValidationError{Fields: []limiter.FieldError{{Field: "op", Message: "is required"}}}
	}
	name, ok := o.String("op")
	if !ok {
		return limiter.Call{}, &input.Error{Detail: "the body has the wrong shape", Fields: []limiter.FieldError{{Field: "op", Message: "must be a string"}}}
	}
	op, ok := ops[name]
	if !ok {
		return limiter.Call{}, &limiter.ValidationError{Fields: []limiter.FieldError{{Field: "op", Message: opProblem}}}
	}
	c := limiter.Call{Op: op}
	start := len(sc.reqs)
	switch op {
	case limiter.Release, limiter.Renew:
		c.LeaseID, c.TTL, err = readLeaseFields(b, op == limiter.Renew)
	case limiter.Acquire:
		sc.reqs, err = h.readStrict(b, sc.reqs, costed, func(o input.Object, errs *input.Errors) { c.TTL = readTTL(o, errs) })
	default:
		sc.reqs, err = h.readStrict(b, sc.reqs, formOf(op), nil)
	}
	if err != nil {
		sc.reqs = sc.reqs[:start]
	}
	return c, err
}

// routeDecisions is the path of the route.
const routeDecisions = "/v1/decisions"
