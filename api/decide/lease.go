package decide

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// maxTTL is the longest ttl_ms a body may ask for, the longest a lease of
// any concurrency limit lives; the Limiter then holds a lease to the
// shortest period of its buckets.
const maxTTL = limiter.MaxLeasePeriod

// ttlProblem and leaseIDProblem word the two fields of the lease routes.
var (
	ttlProblem = "must be an integer from 1 to " + strconv.FormatInt(maxTTL.Milliseconds(), 10) +
		" (milliseconds); leave it out for the longest the lease's limits allow"
	leaseIDProblem = "must be a lease id as acquire returns it (lse_ and 26 characters)"
)

// readTTL reads the optional ttl_ms of a body: 0 when absent, for the
// Limiter's default. A value that is no duration a lease can have, 0
// included, is an error of the field.
func readTTL(o input.Object, errs *input.Errors) time.Duration {
	digits, ok := o.Integer("ttl_ms")
	if !ok {
		return 0
	}
	ms, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || ms < 1 || ms > maxTTL.Milliseconds() {
		errs.Add(input.Join(o.Path(), "ttl_ms"), ttlProblem)
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// acquire takes a lease on concurrency buckets, all or nothing. Its
// answer is a decision's, with the lease, null when denied, and with a
// spend's headers.
func (h *Handler) acquire(w http.ResponseWriter, r *http.Request, sc *scratch) error {
	var ttl time.Duration
	reqs, err := h.read(r, sc, costed, func(o input.Object, errs *input.Errors) { ttl = readTTL(o, errs) })
	if err != nil {
		return err
	}
	res, err := h.cfg.Limiter.Acquire(r.Context(), reqs, ttl)
	if err != nil {
		return err
	}
	sc.x.AddRateLimit(limiter.Spend, res.Result)
	sc.out = append(h.appendAcquired(sc, sc.out, res), '\n')
	sc.answer(w)
	return nil
}

// appendAcquired counts an acquire's buckets and appends its answer to b.
func (h *Handler) appendAcquired(sc *scratch, b []byte, res limiter.LeaseResult) []byte {
	h.cfg.Observer.ObserveAcquire(res.Result)
	sc.fillAcquire(res)
	return sc.result.appendJSON(b)
}

// release frees a lease's units. A lease that is gone is no error, so
// that a retried release is safe; nor is a store that cannot be reached
// while failing open: the lease then expires on its own.
func (h *Handler) release(w http.ResponseWriter, r *http.Request, sc *scratch) error {
	id, _, err := h.readLease(r, sc, false)
	if err != nil {
		return err
	}
	released, err := h.cfg.Limiter.Release(r.Context(), id)
	if sc.out, err = h.appendReleased(sc.out, released, err); err != nil {
		return err
	}
	sc.out = append(sc.out, '\n')
	sc.answer(w)
	return nil
}

// appendReleased appends the answer of a release that answered released
// and err to b, or returns the error that answers it.
func (h *Handler) appendReleased(b []byte, released bool, err error) ([]byte, error) {
	degraded, err := h.degraded(err)
	if err != nil {
		return b, err
	}
	b = append(b, `{"released":`...)
	b = strconv.AppendBool(b, released)
	b = append(b, `,"degraded":`...)
	b = strconv.AppendBool(b, degraded)
	return append(b, '}'), nil
}

// renew extends a lease. One that no longer holds its units is a 404:
// they may be another's by now. Failing open, a store that cannot be
// reached answers the renewal as granted, as it answers acquires, though
// nothing reached the store: the caller goes on until the answer's expiry,
// ttl_ms or, left out, the longest any lease lives.
func (h *Handler) renew(w http.ResponseWriter, r *http.Request, sc *scratch) error {
	id, ttl, err := h.readLease(r, sc, true)
	if err != nil {
		return err
	}
	l, err := h.cfg.Limiter.Renew(r.Context(), id, ttl)
	if sc.out, err = h.appendRenewed(sc, sc.out, id, ttl, l, err); err != nil {
		return err
	}
	sc.out = append(sc.out, '\n')
	sc.answer(w)
	return nil
}

// appendRenewed appends the answer of a renewal of lease id by ttl that
// answered l and err to b, or returns the error that answers it.
func (h *Handler) appendRenewed(sc *scratch, b []byte, id string, ttl time.Duration, l limiter.Lease, err error) ([]byte, error) {
	if errors.Is(err, limiter.ErrLeaseNotFound) {
		return b, problem.Errorf(http.StatusNotFound, "the lease does not exist: it expired, was released or was never held; its units may be another's")
	}
	degraded, err := h.degraded(err)
	if err != nil {
		return b, err
	}
	if degraded {
		if ttl == 0 {
			ttl = maxTTL
		}
		l = limiter.Lease{ID: id, Expires: h.cfg.Now().Add(ttl)}
	}
	sc.lease = lease{ID: l.ID, ExpiresAt: l.Expires.UTC()}
	b = append(b, `{"lease":`...)
	b = sc.lease.appendJSON(b)
	b = append(b, `,"degraded":`...)
	b = strconv.AppendBool(b, degraded)
	return append(b, '}'), nil
}

// degraded applies the fail mode to the error of a release or renewal: a
// store that cannot be reached, failing open, is no error but a degraded
// answer.
func (h *Handler) degraded(err error) (bool, error) {
	if errors.Is(err, limiter.ErrUnavailable) && h.cfg.Limiter.FailOpen() {
		return true, nil
	}
	return false, err
}

// readLease reads the body of a release, {"lease_id"}, or of a renewal,
// which may also hold ttl_ms. Every bad field is named at once: a lease
// id of another shape than acquire gives is refused before any store
// sees it.
func (h *Handler) readLease(r *http.Request, sc *scratch, renewal bool) (string, time.Duration, error) {
	if err := readBody(r, sc); err != nil {
		return "", 0, err
	}
	b, err := input.Parse(sc.body)
	if err != nil {
		return "", 0, err
	}
	return readLeaseFields(b, renewal)
}

// readLeaseFields reads the fields of a parsed release or renewal.
func readLeaseFields(b *input.Body, renewal bool) (string, time.Duration, error) {
	o := b.Root()
	o.Require("lease_id")
	id, ok := o.String("lease_id")
	if ok && !limiter.ValidLeaseID(id) {
		b.Errs.Add("lease_id", leaseIDProblem)
	}
	var ttl time.Duration
	if renewal {
		ttl = readTTL(o, &b.Errs)
	}
	return id, ttl, b.Err()
}
