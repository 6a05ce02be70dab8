//go:build linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratelimitd/ratelimitd/client"
)

// write is one admin write of a stream, as its client saw it.
type write struct {
	op     client.HistoryEntryAction
	bucket string
	// id is the override's, known once its creation was answered.
	id string
	// version is the override's version after the write, when it was
	// acknowledged (0 after a delete).
	version    int64
	start, end time.Time
	// status is the answer's, 0 when none came.
	status int
	// problem is true when a 4xx or 5xx was a problem+json document.
	problem bool
	err     error
}

// acked reports whether the write was acknowledged with a 2xx.
func (w write) acked() bool { return w.status >= 200 && w.status < 300 }

// spans reports whether the write was under way at t: it may or may not
// have been committed when it got no answer or an error.
func (w write) spans(t time.Time) bool { return !w.start.After(t) && !w.end.Before(t) }

// unsent reports whether the write never reached the service: connecting
// was refused.
func (w write) unsent() bool { return errors.Is(w.err, syscall.ECONNREFUSED) }

// writes runs streams of override writes, each a goroutine that creates an
// override, changes it with If-Match and deletes every third one, then
// goes on with the next bucket, until stopped.
type writes struct {
	limit string
	stop  chan struct{}
	wg    sync.WaitGroup

	mu  sync.Mutex
	all []write
}

// startWrites starts streams goroutines writing overrides of limit through
// c, for buckets named prefix, the stream's number and a count. A stream moves to its next bucket when a write is not acknowledged,
// so that each bucket has at most one write of unknown outcome, its last;
// after a failure it waits pause.
func startWrites(t *testing.T, c *client.ClientWithResponses, limit, prefix string, streams int, pause time.Duration) *writes {
	ws := &writes{limit: limit, stop: make(chan struct{})}
	for s := range streams {
		ws.wg.Add(1)
		go func() {
			defer ws.wg.Done()
			for n := 0; ; n++ {
				select {
				case <-ws.stop:
					return
				default:
				}
				if !ws.lifecycle(c, fmt.Sprintf("%s%d-%d", prefix, s, n), n) {
					select {
					case <-ws.stop:
						return
					case <-time.After(pause):
					}
				}
			}
		}()
	}
	t.Cleanup(func() { ws.halt() })
	return ws
}

// lifecycle writes one bucket's override and reports whether every write
// was acknowledged.
func (ws *writes) lifecycle(c *client.ClientWithResponses, bkt string, n int) bool {
	w := write{op: client.HistoryEntryActionCreate, bucket: bkt, start: time.Now()}
	res, err := c.CreateOverrideWithResponse(bg, client.OverrideCreate{
		Limit: ws.limit, BucketID: bkt, Burst: ptr(int64(10 + n)), Count: ptr(int64(10)), Period: ptr("1h"), Comment: ptr("created"),
	})
	w.finish(res, err, http.StatusCreated)
	if w.acked() {
		w.id, w.version = res.JSON201.ID, res.JSON201.Version
	}
	if !ws.record(w) {
		return false
	}
	id := w.id

	w = write{op: client.HistoryEntryActionUpdate, bucket: bkt, id: id, start: time.Now()}
	pres, err := c.PatchOverrideWithResponse(bg, id, &client.PatchOverrideParams{IfMatch: ptr(`"1"`)},
		client.OverridePatch{Comment: ptr("changed"), Burst: ptr(int64(20 + n))})
	w.finish(pres, err, http.StatusOK)
	if w.acked() {
		w.version = pres.JSON200.Version
	}
	if !ws.record(w) || n%3 != 0 {
		return w.acked()
	}

	w = write{op: client.HistoryEntryActionDelete, bucket: bkt, id: id, start: time.Now()}
	dres, err := c.DeleteOverrideWithResponse(bg, id)
	w.finish(dres, err, http.StatusNoContent)
	return ws.record(w)
}

// response is what every generated response has.
type response interface {
	StatusCode() int
}

// finish records the answer of a write whose success is want.
func (w *write) finish(res response, err error, want int) {
	w.end = time.Now()
	if err != nil {
		w.err = err
		return
	}
	w.status = res.StatusCode()
	if w.status != want && w.status >= 400 {
		w.problem = problemOf(res) != nil
	}
}

// record keeps w and reports whether it was acknowledged.
func (ws *writes) record(w write) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.all = append(ws.all, w)
	return w.acked()
}

// count returns the number of writes recorded so far.
func (ws *writes) count() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return len(ws.all)
}

// since returns the writes that started at or after t.
func (ws *writes) since(t time.Time) []write {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var out []write
	for _, w := range ws.all {
		if !w.start.Before(t) {
			out = append(out, w)
		}
	}
	return out
}

// halt stops the streams and returns every write, in the order they
// ended.
func (ws *writes) halt() []write {
	select {
	case <-ws.stop:
	default:
		close(ws.stop)
	}
	ws.wg.Wait()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return append([]write(nil), ws.all...)
}

// verdict summarises a verification of writes.
type verdict struct {
	acked, failed, uncertain, uncertainApplied int
}

func (v verdict) String() string {
	return fmt.Sprintf("%d acknowledged writes present with their history entries; %d refused; %d of unknown outcome, %d of which were committed",
		v.acked, v.failed, v.uncertain, v.uncertainApplied)
}

// verifyWrites checks the database, through the API of c and the audit
// table at dbURL, against what the clients were told:
//
//   - every acknowledged write is there, with its history entry, in order;
//   - a write that was refused left nothing;
//   - a write for which uncertain is true (under way at a crash or at the
//     start of an outage, and not acknowledged) is there entirely, with
//     its history entry, or not at all;
//   - no override and no history entry exists that no write made.
//
// An override's history must count one entry per change, each written by
// actor, the last one describing the override as it is; a deleted
// override's history ends with the deletion.
func verifyWrites(t *testing.T, c *client.ClientWithResponses, dbURL, limit, actor string, all []write, uncertain func(write) bool) verdict {
	t.Helper()
	var v verdict
	byBucket := map[string][]write{}
	var buckets []string
	for _, w := range all {
		if _, ok := byBucket[w.bucket]; !ok {
			buckets = append(buckets, w.bucket)
		}
		byBucket[w.bucket] = append(byBucket[w.bucket], w)
	}
	present := listOverrides(t, c, limit)
	entries := auditCounts(t, dbURL, limit)

	for _, bkt := range buckets {
		ws := byBucket[bkt]
		sort.Slice(ws, func(i, j int) bool { return ws[i].start.Before(ws[j].start) })
		// The states the override may be in: the one the last
		// acknowledged write left, or, after a write of unknown outcome
		// (always the bucket's last), the one that write would leave.
		type state struct {
			exists  bool
			version int64
			// changes is the number of history entries.
			changes int
		}
		cur := state{}
		var id string
		possible := []state{cur}
		for i, w := range ws {
			next := cur
			switch w.op {
			case client.HistoryEntryActionCreate:
				next = state{exists: true, version: 1, changes: 1}
			case client.HistoryEntryActionUpdate:
				next = state{exists: true, version: cur.version + 1, changes: cur.changes + 1}
			case client.HistoryEntryActionDelete:
				next = state{exists: false, version: cur.version, changes: cur.changes + 1}
			}
			if w.id != "" {
				id = w.id
			}
			switch {
			case w.acked():
				v.acked++
				if w.op != client.HistoryEntryActionDelete && w.version != next.version {
					t.Errorf("%s %s: acknowledged at version %d, want %d", w.op, bkt, w.version, next.version)
				}
				cur, possible = next, []state{next}
			case !w.unsent() && uncertain(w):
				v.uncertain++
				if i != len(ws)-1 {
					t.Fatalf("%s %s: a write of unknown outcome is not the bucket's last", w.op, bkt)
				}
				possible = []state{cur, next}
			default:
				v.failed++
				if w.status != 0 && !w.problem {
					t.Errorf("%s %s: answered %d without a problem document", w.op, bkt, w.status)
				}
			}
		}

		o, exists := present[bkt]
		got := state{exists: exists, changes: entries[bkt]}
		if exists {
			got.version = o.Version
		}
		matched := -1
		for i, p := range possible {
			if p.exists == got.exists && (!p.exists || p.version == got.version) && p.changes == got.changes {
				matched = i
			}
		}
		if matched < 0 {
			t.Errorf("bucket %s: exists=%v version=%d with %d history entries; want one of %+v (writes %+v)", bkt, got.exists, got.version, got.changes, possible, ws)
			continue
		}
		if len(possible) == 2 && matched == 1 {
			v.uncertainApplied++
		}
		if exists {
			id = o.ID
		}
		if got.changes > 0 {
			checkHistory(t, c, id, bkt, actor, got.changes, o, exists)
		}
	}
	for bkt := range present {
		if _, ok := byBucket[bkt]; !ok {
			t.Errorf("override of bucket %s exists, but no write made it", bkt)
		}
	}
	for bkt := range entries {
		if _, ok := byBucket[bkt]; !ok {
			t.Errorf("history entries of bucket %s exist, but no write made them", bkt)
		}
	}
	return v
}

// checkHistory checks an override's history through the API: changes
// entries by actor, a creation first, versions in order, and the last one
// the override as it is (exists) or its deletion.
func checkHistory(t *testing.T, c *client.ClientWithResponses, id, bkt, actor string, changes int, o client.Override, exists bool) {
	t.Helper()
	res, err := c.OverrideHistoryWithResponse(bg, id)
	if err != nil {
		t.Errorf("history of %s (%s): %v", bkt, id, err)
		return
	}
	if res.JSON200 == nil {
		t.Errorf("history of %s (%s): %d %s", bkt, id, res.StatusCode(), res.Body)
		return
	}
	h := res.JSON200.Entries
	if len(h) != changes {
		t.Errorf("history of %s: %d entries, want %d", bkt, len(h), changes)
		return
	}
	for i, e := range h {
		if e.Actor != actor {
			t.Errorf("history of %s: entry %d by %q, want %q", bkt, i, e.Actor, actor)
		}
		want := client.HistoryEntryActionUpdate
		switch {
		case i == 0:
			want = client.HistoryEntryActionCreate
		case i == len(h)-1 && !exists:
			want = client.HistoryEntryActionDelete
		}
		if e.Action != want {
			t.Errorf("history of %s: entry %d is a %s, want a %s", bkt, i, e.Action, want)
			continue
		}
		if e.Action != client.HistoryEntryActionDelete && (e.After == nil || e.After.Version != int64(i+1)) {
			t.Errorf("history of %s: entry %d does not describe version %d", bkt, i, i+1)
		}
	}
	if last := h[len(h)-1]; exists && last.After != nil {
		if last.After.Version != o.Version || last.After.Comment != o.Comment || *last.After.Burst != *o.Burst {
			t.Errorf("history of %s: the last entry %+v is not the override %+v", bkt, *last.After, o)
		}
	}
}

// listOverrides returns every override of limit by bucket, through every
// page.
func listOverrides(t *testing.T, c *client.ClientWithResponses, limit string) map[string]client.Override {
	t.Helper()
	out := map[string]client.Override{}
	params := &client.ListOverridesParams{Limit: &limit, PageSize: ptr(1000)}
	for {
		res, err := c.ListOverridesWithResponse(bg, params)
		if err != nil {
			t.Fatalf("GET /v1/overrides: %v", err)
		}
		if res.JSON200 == nil {
			t.Fatalf("GET /v1/overrides: %d %s", res.StatusCode(), res.Body)
		}
		for _, o := range res.JSON200.Overrides {
			out[o.BucketID] = o
		}
		if res.JSON200.NextPageToken == "" {
			return out
		}
		params.PageToken = &res.JSON200.NextPageToken
	}
}

// auditCounts counts the history entries of the overrides of limit by
// bucket, in the audit table itself: the API shows an override's history
// by its id, which a client whose creation got no answer never learnt, so
// only the table can show that such a creation left no entry behind. This
// couples the test to the audit table's columns (migrations/postgres).
func auditCounts(t *testing.T, dbURL, limit string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connecting to the test database: %v", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT bucket_id, count(*) FROM audit WHERE entity = 'override' AND limit_name = $1 GROUP BY bucket_id`, limit)
	if err != nil {
		t.Fatalf("reading the audit table: %v", err)
	}
	out := map[string]int{}
	for rows.Next() {
		var bkt string
		var n int
		if err := rows.Scan(&bkt, &n); err != nil {
			t.Fatal(err)
		}
		out[bkt] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// problemOf returns the problem a generated response decoded, nil when it
// decoded none.
func problemOf(res response) *client.Problem {
	switch r := res.(type) {
	case *client.CreateOverrideResponse:
		return firstProblem(r.ApplicationProblemJSON400, r.ApplicationProblemJSON401, r.ApplicationProblemJSON403,
			r.ApplicationProblemJSON409, r.ApplicationProblemJSON413, r.ApplicationProblemJSON415, r.ApplicationProblemJSON422, r.ApplicationProblemJSON503)
	case *client.PatchOverrideResponse:
		return firstProblem(r.ApplicationProblemJSON400, r.ApplicationProblemJSON401, r.ApplicationProblemJSON403, r.ApplicationProblemJSON404,
			r.ApplicationProblemJSON412, r.ApplicationProblemJSON413, r.ApplicationProblemJSON415, r.ApplicationProblemJSON422, r.ApplicationProblemJSON503)
	case *client.DeleteOverrideResponse:
		return firstProblem(r.ApplicationProblemJSON401, r.ApplicationProblemJSON403, r.ApplicationProblemJSON404, r.ApplicationProblemJSON503)
	}
	return nil
}

func firstProblem(ps ...*client.Problem) *client.Problem {
	for _, p := range ps {
		if p != nil {
			return p
		}
	}
	return nil
}
