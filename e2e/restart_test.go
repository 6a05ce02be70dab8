//go:build linux

package e2e

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// TestRestart restarts the service, gracefully (SIGTERM) and not (SIGKILL),
// on Postgres and Redis: limits with their enums, overrides, and the
// buckets' states must be as they were.
func TestRestart(t *testing.T) {
	t.Parallel()
	svc := newService(t, "ratelimitd", options{redisURL: testenv.RedisURL(t)})
	admin := svc.admin()

	putLimit(t, admin, "RestartExplicit", client.LimitPut{Enum: ptr(4242), IDFormat: client.IDFormatRegID, Burst: ptr(int64(10)), Count: ptr(int64(10)), Period: ptr("1h"), Description: ptr("an explicit enum")})
	putLimit(t, admin, "RestartAssigned", client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(10)), Count: ptr(int64(10)), Period: ptr("1h"), Shadow: ptr(false)})
	// A name of Let's Encrypt's catalogue takes its enum (3) from there.
	imp, err := admin.ImportFileWithBodyWithResponse(bg, &client.ImportFileParams{Kind: client.ImportFileParamsKindDefaults}, "application/yaml",
		strings.NewReader("NewOrdersPerAccount:\n  burst: 300\n  count: 1\n  period: 3h\n"))
	if err != nil || imp.JSON200 == nil || imp.JSON200.Created != 1 {
		t.Fatalf("importing defaults: %v", describe(imp, err))
	}
	createOverride(t, admin, client.OverrideCreate{Limit: "RestartExplicit", BucketID: "007", Burst: ptr(int64(3)), Count: ptr(int64(3)), Period: ptr("1h"), Comment: ptr("three")})
	createOverride(t, admin, client.OverrideCreate{Limit: "RestartAssigned", BucketID: "free", Unlimited: ptr(true)})
	createOverride(t, admin, client.OverrideCreate{Limit: "RestartAssigned", BucketID: "off", Burst: ptr(int64(0)), Count: ptr(int64(1)), Period: ptr("1h"), Enabled: ptr(false)})
	waitFor(t, 10*time.Second, "the overrides in the snapshot", func() bool {
		d, ok := inspect(admin, "RestartAssigned", "free")
		return usesOverride(admin, "RestartExplicit", "7", 3) && ok && d.Source == client.DecisionSourceUnlimited
	})

	// Bucket states: 4 of 10 tokens spent; an override's 3 of 3; NewOrders'
	// 1 of 300. With one token in 6 minutes (3 hours for NewOrders)
	// nothing refills while the test runs, however slowly it restarts.
	spendN(t, admin, "RestartAssigned", "b", 4)
	spendN(t, admin, "RestartExplicit", "7", 3)
	spendN(t, admin, "NewOrdersPerAccount", "12345", 1)
	buckets := [][2]string{{"RestartAssigned", "b"}, {"RestartExplicit", "7"}, {"NewOrdersPerAccount", "12345"}, {"RestartAssigned", "free"}, {"RestartAssigned", "off"}}

	before := snapshotOf(t, admin, buckets)
	if got := before.limits["RestartExplicit"].Enum; got != 4242 {
		t.Errorf("RestartExplicit has enum %d, want 4242", got)
	}
	if got := before.limits["RestartAssigned"].Enum; got < 100 {
		t.Errorf("RestartAssigned has enum %d, want one from 100 up", got)
	}
	if got := before.limits["NewOrdersPerAccount"].Enum; got != 3 {
		t.Errorf("NewOrdersPerAccount has enum %d, want the catalogue's 3", got)
	}
	if got := before.remaining["RestartAssigned/b"]; got != 6 {
		t.Errorf("RestartAssigned/b has %d tokens left before the restart, want 6", got)
	}

	for _, how := range []string{"SIGTERM", "SIGKILL"} {
		if how == "SIGTERM" {
			if err := svc.terminate(); err != nil {
				t.Errorf("after SIGTERM the process exited with %v, want success", err)
			}
		} else {
			svc.kill()
		}
		svc.start()
		after := snapshotOf(t, admin, buckets)
		if !reflect.DeepEqual(after, before) {
			t.Errorf("after a restart by %s:\n got %+v\nwant %+v", how, after, before)
		}
	}
}

// spendN spends one token of a bucket n times, each allowed.
func spendN(t *testing.T, c *client.ClientWithResponses, limit, id string, n int) {
	t.Helper()
	for range n {
		res, err := c.SpendWithResponse(bg, bucket(limit, id))
		if err != nil || res.JSON200 == nil || !res.JSON200.Allowed {
			t.Fatalf("spending %s/%s: %v", limit, id, describe(res, err))
		}
	}
}

// state is what must survive a restart.
type state struct {
	limits    map[string]client.Limit
	overrides map[string]client.Override
	exports   map[client.ExportFileParamsKind]string
	// remaining and source are a check's on each bucket, by limit/id.
	remaining map[string]int64
	source    map[string]client.DecisionSource
}

func snapshotOf(t *testing.T, c *client.ClientWithResponses, buckets [][2]string) state {
	t.Helper()
	s := state{limits: map[string]client.Limit{}, overrides: map[string]client.Override{}, exports: map[client.ExportFileParamsKind]string{},
		remaining: map[string]int64{}, source: map[string]client.DecisionSource{}}
	lres, err := c.ListLimitsWithResponse(bg)
	if err != nil || lres.JSON200 == nil {
		t.Fatalf("GET /v1/limits: %v", describe(lres, err))
	}
	for _, l := range lres.JSON200.Limits {
		s.limits[l.Name] = l
		for id, o := range listOverrides(t, c, l.Name) {
			s.overrides[l.Name+"/"+id] = o
		}
	}
	for _, kind := range []client.ExportFileParamsKind{client.ExportFileParamsKindDefaults, client.ExportFileParamsKindOverrides} {
		res, err := c.ExportFileWithResponse(bg, &client.ExportFileParams{Kind: kind})
		if err != nil || res.StatusCode() != 200 {
			t.Fatalf("GET /v1/export?kind=%s: %v", kind, describe(res, err))
		}
		s.exports[kind] = string(res.Body)
	}
	for _, b := range buckets {
		d := check(t, c, b[0], b[1], 0)
		s.remaining[b[0]+"/"+b[1]] = d.Remaining
		s.source[b[0]+"/"+b[1]] = d.Source
	}
	return s
}
