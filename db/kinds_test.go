package db

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

func quotaOf(name string, c limiter.Calendar, zone string, count int64) limiter.Limit {
	return limiter.Limit{Name: name, IDFormat: limiter.String, Kind: limiter.KindRate, Calendar: c, TimeZone: zone,
		Params: limiter.Params{Burst: count, Count: count}, Unit: limiter.DefaultUnit}
}

func leasesOf(name string, burst int64, ttl time.Duration) limiter.Limit {
	return limiter.Limit{Name: name, IDFormat: limiter.String, Kind: limiter.KindConcurrency,
		Params: limiter.Params{Burst: burst, Count: burst, Period: ttl}, Unit: limiter.DefaultUnit}
}

// wantInvalid checks that err is a validation error naming exactly fields.
func wantInvalid(t *testing.T, err error, fields ...string) {
	t.Helper()
	var ve *limiter.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error = %v, want a validation error naming %v", err, fields)
	}
	got := map[string]bool{}
	for _, f := range ve.Fields {
		got[f.Field] = true
	}
	for _, f := range fields {
		if !got[f] {
			t.Errorf("%v does not name %s", ve, f)
		}
	}
	if len(got) != len(fields) {
		t.Errorf("%v names other fields than %v", ve, fields)
	}
}

// lastAudit returns the document after the last change of a limit.
func lastAudit(t *testing.T, e *env, name string) map[string]any {
	t.Helper()
	var after string
	err := e.db.reader.QueryRowContext(ctxT(t), `SELECT after FROM audit WHERE entity = 'limit' AND entity_id = $1 ORDER BY seq DESC LIMIT 1`, name).Scan(&after)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(after), &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// loads checks that a replica can load what the database holds: a
// snapshot refuses an override that does not fit its limit.
func loads(t *testing.T, e *env) {
	t.Helper()
	b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	if _, err := e.db.Full(ctxT(t), b.PutLimit, b.PutOverride); err != nil {
		t.Fatalf("a full load: %v", err)
	}
}

// TestLimitKinds stores each kind, refuses every change of kind, and
// gives a quota whose calendar or zone changes a new generation, unless
// one of its overrides would no longer fit.
func TestLimitKinds(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		quota := e.putLimit(t, quotaOf("Exports", limiter.CalendarMonth, "Europe/Paris", 10))
		leases := e.putLimit(t, leasesOf("ModelCalls", 8, 30*time.Second))
		rate := e.putLimit(t, limitOf("Orders", limiter.String))
		for _, l := range []limiter.Limit{quota, leases, rate} {
			if got, err := e.db.GetLimit(ctx, l.Name); err != nil || got != l {
				t.Errorf("GetLimit(%s) = %+v, %v; want %+v", l.Name, got, err, l)
			}
		}
		if doc := lastAudit(t, e, "Exports"); doc["kind"] != "rate" || doc["calendar"] != "month" || doc["time_zone"] != "Europe/Paris" || doc["period"] != nil {
			t.Errorf("the quota's audit document: %v", doc)
		}
		if doc := lastAudit(t, e, "ModelCalls"); doc["kind"] != "concurrency" || doc["calendar"] != nil || doc["time_zone"] != nil || doc["period"] != "30s" {
			t.Errorf("the concurrency limit's audit document: %v", doc)
		}

		// No limit changes kind, nor becomes a quota or stops being one.
		v := e.version(t)
		for _, change := range []struct{ from, to limiter.Limit }{
			{rate, leasesOf("Orders", 8, time.Second)},
			{rate, quotaOf("Orders", limiter.CalendarDay, "UTC", 10)},
			{quota, limitOf("Exports", limiter.String)},
			{quota, leasesOf("Exports", 10, time.Second)},
			{leases, limitOf("ModelCalls", limiter.String)},
		} {
			_, _, err := e.db.PutLimit(ctx, "alice", change.to)
			wantError(t, err, limiter.ErrKindFixed)
			if got, _ := e.db.GetLimit(ctx, change.from.Name); got != change.from {
				t.Errorf("%s changed: %+v", change.from.Name, got)
			}
		}
		if e.version(t) != v {
			t.Error("a refused change wrote")
		}

		// A new count keeps the windows' usage; a new calendar or zone
		// starts a generation.
		raised := quotaOf("Exports", limiter.CalendarMonth, "Europe/Paris", 20)
		if got := e.putLimit(t, raised); got.Generation != 1 {
			t.Errorf("a new count: generation %d, want 1", got.Generation)
		}
		weekly := quotaOf("Exports", limiter.CalendarWeek, "Europe/Paris", 20)
		if got := e.putLimit(t, weekly); got.Generation != 2 {
			t.Errorf("a new calendar: generation %d, want 2", got.Generation)
		}
		if doc := lastAudit(t, e, "Exports"); doc["calendar"] != "week" || doc["generation"] != float64(2) {
			t.Errorf("the audit of the new calendar: %v", doc)
		}
		tokyo := quotaOf("Exports", limiter.CalendarWeek, "Asia/Tokyo", 20)
		if got := e.putLimit(t, tokyo); got.Generation != 3 {
			t.Errorf("a new zone: generation %d, want 3", got.Generation)
		}
		if got, _ := e.db.GetLimit(ctx, "Exports"); got.Generation != 3 {
			t.Errorf("stored generation %d, want 3", got.Generation)
		}

		// An override the hourly calendar cannot hold keeps the calendar
		// as it is.
		big := e.createOverride(t, limiter.Override{Limit: "Exports", BucketID: "big", Enabled: false,
			Params: limiter.Params{Burst: 1_000_000_000, Count: 1_000_000_000}})
		e.createOverride(t, limiter.Override{Limit: "Exports", BucketID: "free", Unlimited: true, Enabled: true})
		v = e.version(t)
		_, _, err := e.db.PutLimit(ctx, "alice", quotaOf("Exports", limiter.CalendarHour, "Asia/Tokyo", 20))
		wantInvalid(t, err, "calendar")
		if got, _ := e.db.GetLimit(ctx, "Exports"); got.Calendar != limiter.CalendarWeek || got.Generation != 3 || e.version(t) != v {
			t.Errorf("a refused calendar wrote: %+v", got)
		}
		var generation int
		if err := e.db.reader.QueryRowContext(ctx, `SELECT generation FROM enums WHERE enum = $1`, quota.Enum).Scan(&generation); err != nil || generation != 3 {
			t.Errorf("enums.generation = %d, %v; want 3", generation, err)
		}
		if _, err := e.db.UpdateOverride(ctx, "alice", big.ID, func(o *limiter.Override, _ limiter.Limit) error {
			o.Burst, o.Count = 5, 5
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if got := e.putLimit(t, quotaOf("Exports", limiter.CalendarHour, "Asia/Tokyo", 20)); got.Generation != 4 {
			t.Errorf("an hourly quota: generation %d, want 4", got.Generation)
		}
		loads(t, e)
	})
}

// TestOverridesFitTheirLimit: the parameters of an override are checked
// against its limit as the write transaction reads it.
func TestOverridesFitTheirLimit(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, quotaOf("Exports", limiter.CalendarHour, "UTC", 10))
		e.putLimit(t, leasesOf("ModelCalls", 8, 30*time.Second))
		before := e.rowCounts(t)
		for _, bad := range []struct {
			o      limiter.Override
			fields []string
		}{
			{limiter.Override{Limit: "Exports", BucketID: "a", Params: limiter.Params{Burst: 5, Count: 5, Period: time.Hour}}, []string{"period"}},
			{limiter.Override{Limit: "Exports", BucketID: "a", Params: limiter.Params{Burst: 6, Count: 5}}, []string{"burst"}},
			{limiter.Override{Limit: "Exports", BucketID: "a", Params: limiter.Params{Burst: 1e12, Count: 1e12}}, []string{"count"}},
			{limiter.Override{Limit: "ModelCalls", BucketID: "a", Params: limiter.Params{Burst: 5, Count: 5, Period: 48 * time.Hour}}, []string{"period"}},
			{limiter.Override{Limit: "ModelCalls", BucketID: "a", Params: limiter.Params{Burst: 5, Count: 4, Period: time.Minute}}, []string{"count"}},
		} {
			_, err := e.db.CreateOverride(ctx, "bob", bad.o)
			wantInvalid(t, err, bad.fields...)
		}
		if after := e.rowCounts(t); after["overrides"] != before["overrides"] || after["audit"] != before["audit"] {
			t.Errorf("refused overrides wrote: %v -> %v", before, after)
		}

		blocked := e.createOverride(t, limiter.Override{Limit: "Exports", BucketID: "a", Enabled: true})
		if blocked.Params != (limiter.Params{}) {
			t.Errorf("a quota's blocking override: %+v", blocked.Params)
		}
		_, err := e.db.UpdateOverride(ctx, "bob", blocked.ID, func(o *limiter.Override, l limiter.Limit) error {
			if !l.Quota() {
				t.Errorf("change got the limit %+v", l)
			}
			o.Count = 5 // and the burst left 0
			return nil
		})
		wantInvalid(t, err, "burst")
		if got, _ := e.db.GetOverride(ctx, blocked.ID); got.Version != 1 {
			t.Errorf("a refused change wrote: %+v", got)
		}
		loads(t, e)
	})
}

// TestImportKinds: an import upserts limits as PutLimit does, kinds and
// generations included, and refuses an override that does not fit its
// limit.
func TestImportKinds(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		quota := e.putLimit(t, quotaOf("Exports", limiter.CalendarDay, "UTC", 10))
		e.putLimit(t, leasesOf("ModelCalls", 8, 30*time.Second))
		v := e.version(t)
		_, err := e.db.Import(ctx, "importer", []limiter.Limit{limitOf("ModelCalls", limiter.String)}, nil, false)
		wantError(t, err, limiter.ErrKindFixed)
		_, err = e.db.Import(ctx, "importer", nil, []limiter.Override{{Limit: "Exports", BucketID: "a",
			Params: limiter.Params{Burst: 5, Count: 5, Period: time.Hour}}}, false)
		wantError(t, err, limiter.ErrParamsRefused)
		if e.version(t) != v {
			t.Error("a refused import wrote")
		}

		paris := quotaOf("Exports", limiter.CalendarDay, "Europe/Paris", 10)
		counts, err := e.db.Import(ctx, "importer", []limiter.Limit{paris}, []limiter.Override{{Limit: "Exports", BucketID: "a",
			Params: limiter.Params{Burst: 50, Count: 50}}}, false)
		if err != nil || counts.Updated != 1 || counts.Created != 1 {
			t.Fatalf("Import = %+v, %v", counts, err)
		}
		if got, _ := e.db.GetLimit(ctx, "Exports"); got.TimeZone != "Europe/Paris" || got.Generation != quota.Generation+1 {
			t.Errorf("the imported zone: %+v", got)
		}
		// The next new generation follows the enums table.
		if got := e.putLimit(t, quotaOf("Exports", limiter.CalendarWeek, "Europe/Paris", 10)); got.Generation != quota.Generation+2 {
			t.Errorf("after the import, generation %d", got.Generation)
		}
		loads(t, e)
	})
}

// TestRulesNeedNoLeases: a rule cannot name a concurrency limit, since
// ShouldRateLimit cannot hold leases; a calendar quota is fine.
func TestRulesNeedNoLeases(t *testing.T) {
	run(t, func(t *testing.T, e *env) {
		ctx := ctxT(t)
		e.putLimit(t, quotaOf("Exports", limiter.CalendarDay, "UTC", 10))
		e.putLimit(t, leasesOf("ModelCalls", 8, 30*time.Second))
		desc := []limiter.DescriptorEntry{{Key: "user"}}
		_, err := e.db.CreateRule(ctx, "alice", limiter.Rule{Domain: "d", Descriptor: desc, Limit: "ModelCalls"})
		wantInvalid(t, err, "limit")
		r, err := e.db.CreateRule(ctx, "alice", limiter.Rule{Domain: "d", Descriptor: desc, Limit: "Exports"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.db.SetRuleLimit(ctx, "alice", r.ID, "ModelCalls")
		wantInvalid(t, err, "limit")
		_, err = e.db.ImportRules(ctx, "alice", "e", nil, []limiter.Rule{{Domain: "e", Descriptor: desc, Limit: "ModelCalls"}}, nil, false, false)
		wantInvalid(t, err, "limit")
		if got, _ := e.db.GetRule(ctx, r.ID); got.Limit != "Exports" {
			t.Errorf("the rule: %+v", got)
		}
	})
}
