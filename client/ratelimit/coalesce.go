package ratelimit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// How calls share requests. A call joins the queue; when fewer than
// maxInFlight requests are out, a sender goroutine starts, takes the
// queue (up to maxBatch calls and maxBody bytes) and sends it, and goes
// on taking and sending until it finds the queue empty. So a call that
// finds a free slot goes at once, alone or with whatever queued before it,
// and the calls that arrive while every slot is busy go together in the
// next request a sender makes. Nothing waits on a timer.

// maxBody bounds the body of one request, well below what ratelimitd
// takes, by an estimate of each call's size.
const maxBody = 512 << 10

// maxAnswer bounds the answer read: 1,000 results of 100 decisions each
// fit.
const maxAnswer = 64 << 20

func (c *Client) enqueue(cl *call) {
	c.mu.Lock()
	c.queue = append(c.queue, cl)
	start := c.inFlight < c.maxInFlight
	if start {
		c.inFlight++
	}
	c.mu.Unlock()
	if start {
		go c.run()
	}
}

// run sends the queue, batch after batch, until it finds it empty.
func (c *Client) run() {
	sc := c.getScratch()
	defer c.scratch.Put(sc)
	for {
		c.mu.Lock()
		n, size := 0, 0
		for n < len(c.queue) && n < c.maxBatch {
			size += c.queue[n].bytes
			if n > 0 && size > maxBody {
				break
			}
			n++
		}
		if n == 0 {
			c.inFlight--
			c.mu.Unlock()
			clear(sc.batch)
			return
		}
		sc.batch = append(sc.batch[:0], c.queue[:n]...)
		rest := copy(c.queue, c.queue[n:])
		clear(c.queue[rest:])
		c.queue = c.queue[:rest]
		c.mu.Unlock()
		c.send(sc)
	}
}

// size bounds from above the bytes a call takes in a body: its strings
// as appendString escapes them, a control character taking six bytes,
// and room for every other member.
func (cl *call) size() int {
	n := 64 + escapedLen(cl.leaseID)
	for _, b := range cl.buckets {
		n += 56 + escapedLen(b.Limit) + escapedLen(b.ID)
	}
	for _, s := range cl.settlements {
		n += 96 + escapedLen(s.Limit) + escapedLen(s.ID)
	}
	return n
}

// escapedLen is the length of s as appendString writes it, quotes left
// out.
func escapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"', c == '\\', c == '\n', c == '\r', c == '\t':
			n++
		case c < 0x20:
			n += 5
		}
	}
	return n
}

// send makes one request for the calls of sc.batch that are still waited
// for, and hands each its answer.
func (c *Client) send(sc *scratch) {
	now := time.Now()
	live := sc.live[:0]
	var deadline time.Time
	for _, cl := range sc.batch {
		// A call whose caller has gone is not sent: nobody would read its
		// answer. It is not handed back to the pool either; its caller
		// may still be reading cl.done.
		if cl.ctx.Err() != nil || !now.Before(cl.deadline) {
			if cl.probe {
				c.breaker.abandon()
			}
			continue
		}
		live = append(live, cl)
		if cl.deadline.After(deadline) {
			deadline = cl.deadline
		}
	}
	sc.live = live
	if len(live) == 0 {
		return
	}

	body := append(sc.body[:0], `{"requests":[`...)
	for i, cl := range live {
		if i > 0 {
			body = append(body, ',')
		}
		body = appendCall(body, cl)
	}
	body = append(body, "]}"...)
	sc.body = body

	// The request lasts as long as its longest-waiting call: past that,
	// nobody would read its answer.
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	err := c.post(ctx, sc)
	if err == nil {
		if err = decodeAnswer(sc.answer, live, sc); err != nil {
			err = unavailable(err)
		}
	}
	took := time.Since(start)
	// A request refused as a whole for its body was answered: ratelimitd
	// is up, and the breaker hears of a success.
	c.breaker.record(c.now(), err == nil || !errors.Is(err, ErrUnavailable))
	if c.hooks.Request != nil {
		c.hooks.Request(len(live), took, err)
	}
	var refused *Problem
	if err != nil && !errors.Is(err, ErrUnavailable) {
		errors.As(err, &refused)
	}
	for i, cl := range live {
		switch {
		case refused != nil:
			cl.res, cl.err = Result{}, refused.of(i)
		case err != nil:
			cl.res, cl.err = Result{}, err
		}
		cl.done <- struct{}{}
	}
	clear(sc.live)
}

// post sends sc.body and reads the answer into sc.answer. A refusal of
// the body (400, 413, 422) is its *Problem: ratelimitd answered, and
// asking again would be refused again. Anything else but a 200 with a
// body is an error wrapping ErrUnavailable.
func (c *Client) post(ctx context.Context, sc *scratch) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(sc.body))
	if err != nil {
		return unavailable(err)
	}
	req.Header["Authorization"] = []string{c.auth}
	req.Header["Content-Type"] = []string{"application/json"}
	res, err := c.http.Do(req)
	if err != nil {
		return unavailable(err)
	}
	defer res.Body.Close()
	buf := bytes.NewBuffer(sc.answer[:0])
	_, err = buf.ReadFrom(io.LimitReader(res.Body, maxAnswer+1))
	sc.answer = buf.Bytes()
	switch {
	case err != nil:
		return fmt.Errorf("%w: reading the answer: %w", ErrUnavailable, err)
	case len(sc.answer) > maxAnswer:
		return fmt.Errorf("%w: the answer is longer than %d bytes", ErrUnavailable, maxAnswer)
	case refusedBody(res.StatusCode):
		return refusal(res.StatusCode, sc.answer)
	case res.StatusCode != http.StatusOK:
		return unavailable(statusError(res.StatusCode, sc.answer))
	}
	return nil
}

// refusedBody reports whether a status of the whole request says that its
// body was refused: not JSON of the right shape (400), too large (413),
// or of values ratelimitd takes from no one (422). The calls' own checks
// (call.validate) keep this from happening; should it, it is no sign of a
// ratelimitd down, and the fail mode does not answer it. Other 4xx are:
// a token refused (401, 403) or a ratelimitd without the route (404) will
// not decide however the call is written.
func refusedBody(status int) bool {
	return status == http.StatusBadRequest || status == http.StatusRequestEntityTooLarge || status == http.StatusUnprocessableEntity
}

// of returns the problem of a whole request as the i-th call it carried
// has it: the fields that ratelimitd named by that call's place in the
// body ("requests[2].lease_id"), named as the call's own ("lease_id"), as
// a problem of the call alone names them; the other calls' fields left
// out, which are not this call's to mend.
func (p *Problem) of(i int) *Problem {
	q := *p
	q.Errors = nil
	prefix := "requests[" + strconv.Itoa(i) + "]."
	for _, f := range p.Errors {
		if field, ok := strings.CutPrefix(f.Field, prefix); ok {
			q.Errors = append(q.Errors, FieldError{Field: field, Message: f.Message})
		}
	}
	return &q
}

// refusal is the *Problem of a whole request refused with status: the
// answer's own problem, or one of the status alone.
func refusal(status int, body []byte) *Problem {
	r := reader{b: body}
	if p := r.problem(); r.err == nil && p.Status == status {
		return p
	}
	return &Problem{Status: status, Title: http.StatusText(status), Detail: "ratelimitd refused the request that carried the call"}
}

// statusError words an answer other than 200 to the whole request: the
// problem's detail when it has one.
func statusError(status int, body []byte) error {
	r := reader{b: body}
	if p := r.problem(); r.err == nil {
		return p
	}
	return errors.New("answered " + strconv.Itoa(status) + " " + http.StatusText(status))
}

// unavailable wraps cause in ErrUnavailable.
func unavailable(cause error) error { return fmt.Errorf("%w: %w", ErrUnavailable, cause) }

// scratch is a sender's working memory, pooled.
type scratch struct {
	batch, live  []*call
	body, answer []byte
	// names interns limit names and the words of decisions; periods keeps
	// the periods read, so that answers repeating them cost no
	// allocation.
	names   map[string]string
	periods map[string]time.Duration
}

// Bounds of what a pooled scratch keeps, so that one unusual answer does
// not pin its memory.
const (
	maxPooledBody = 1 << 20
	maxInterned   = 256
	maxLimitName  = 64
)

func (c *Client) getScratch() *scratch {
	sc, ok := c.scratch.Get().(*scratch)
	if !ok {
		return &scratch{names: make(map[string]string), periods: make(map[string]time.Duration)}
	}
	if cap(sc.answer) > maxPooledBody {
		sc.answer = nil
	}
	if cap(sc.body) > maxPooledBody {
		sc.body = nil
	}
	return sc
}

// intern returns b as a string, without allocating when it was seen
// before.
func (sc *scratch) intern(b []byte) string {
	if s, ok := sc.names[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(b) <= maxLimitName && len(sc.names) < maxInterned {
		sc.names[s] = s
	}
	return s
}

// period parses a Go duration, as answers give a limit's period.
func (sc *scratch) period(b []byte) (time.Duration, bool) {
	if d, ok := sc.periods[string(b)]; ok {
		return d, true
	}
	d, err := time.ParseDuration(string(b))
	if err != nil {
		return 0, false
	}
	if len(sc.periods) < maxInterned {
		sc.periods[string(b)] = d
	}
	return d, true
}
