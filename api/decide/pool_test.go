package decide

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/api/edge"
	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/limiter"
)

type admitAll struct{}

func (admitAll) Authenticate(string) (auth.Principal, bool) {
	return auth.Principal{Scope: auth.Admin}, true
}

// TestPooledScratchKeepsNoLargeMemory: the working memory of a request
// goes back to the pool without what a large body grew, nor the request's
// Exchange, whether the route answered or failed: the pool may keep it
// for as long as no request takes it again.
func TestPooledScratchKeepsNoLargeMemory(t *testing.T) {
	h := New(Config{Auth: admitAll{}})
	var seen *scratch
	var fail bool
	rt := &route{path: "/v1/test", serve: func(_ *Handler, _ http.ResponseWriter, r *http.Request, sc *scratch) error {
		seen = sc
		if err := readBody(r, sc); err != nil {
			return err
		}
		sc.out = append(sc.out, sc.body...)
		sc.reqs = append(sc.reqs, make([]limiter.Request, len(sc.body)/64)...)
		if fail {
			return errors.New("refused")
		}
		return nil
	}}
	for _, size := range []int{100, 2 * maxPooledBody} {
		for _, fail = range []bool{false, true} {
			r := httptest.NewRequest(http.MethodPost, rt.path, strings.NewReader(strings.Repeat("a", size)))
			r.Header.Set("Authorization", "Bearer x")
			r.Header.Set("Content-Type", "application/json")
			x := new(edge.Exchange)
			_ = h.serve(x, r, rt)
			switch {
			case seen == nil:
				t.Fatal("the route did not run")
			case cap(seen.body) > maxPooledBody || cap(seen.out) > maxPooledBody || cap(seen.reqs) > maxPooledItems:
				t.Errorf("a body of %d bytes (failed %v): pooled with %d bytes of body, %d of answer, %d requests",
					size, fail, cap(seen.body), cap(seen.out), cap(seen.reqs))
			case seen.x != nil:
				t.Errorf("a body of %d bytes (failed %v): pooled with its Exchange", size, fail)
			case size < maxPooledBody && cap(seen.body) < size:
				t.Errorf("a body of %d bytes: its memory was not kept for the next", size)
			}
		}
	}
}
