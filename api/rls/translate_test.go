package rls_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestSpellingsOfOneBucketSpendTogether: descriptors that name one bucket
// in two notations are one bucket, spent once with their hits added, and
// each keeps its own status. Were they refused as a bad request instead, a
// client that controls one of the values would pass unlimited through an
// Envoy that lets requests through when the service errs.
func TestSpellingsOfOneBucketSpendTogether(t *testing.T) {
	e := newEnv(t, engines[0], envOptions{})
	e.limit(perMinute("PerIP", limiter.IPAddress, 3, 3))
	e.rule("edge", "PerIP", "remote_address", "")
	e.rule("edge", "PerIP", "x_forwarded_for", "")

	res := e.must(request("edge", desc("remote_address", "10.0.0.1"), desc("x_forwarded_for", "::ffff:10.0.0.1")))
	wantCodes(t, res, ok, ok, ok)
	for i, st := range res.GetStatuses() {
		if st.GetLimitRemaining() != 1 {
			t.Errorf("statuses[%d]: %d left of 3 after two hits, want 1", i, st.GetLimitRemaining())
		}
	}
	// Two more hits do not fit in the one left, and spend nothing.
	res = e.must(request("edge", desc("x_forwarded_for", "::FFFF:10.0.0.1"), desc("remote_address", "10.0.0.1")))
	wantCodes(t, res, over, over, over)
	res = e.must(request("edge", desc("remote_address", "::ffff:10.0.0.1")))
	wantCodes(t, res, ok, ok)
	if st := res.GetStatuses()[0]; st.GetLimitRemaining() != 0 {
		t.Errorf("%d left after three hits of 3", st.GetLimitRemaining())
	}

	// A value the id format refuses is still named by its descriptor.
	_, err := e.call(request("edge", desc("remote_address", "10.0.0.1"), desc("x_forwarded_for", "not-an-address")))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "descriptors[1].entries[0].value") {
		t.Errorf("a bad address: %v", err)
	}
}
