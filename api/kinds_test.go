package api_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

// TestLimitKinds writes a limit of each sort, with the defaults a client
// may leave out, reads them back, and refuses every change of kind.
func TestLimitKinds(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			quota := e.do("PUT", "/v1/limits/Exports", e.admin, obj{"id_format": "string", "calendar": "day", "count": 1000}).
				expect(t, http.StatusCreated).object(t)
			if quota["kind"] != "rate" || quota["calendar"] != "day" || quota["time_zone"] != "UTC" || quota["burst"] != float64(1000) ||
				quota["count"] != float64(1000) || quota["period"] != nil {
				t.Errorf("a quota: %v", quota)
			}
			leases := e.do("PUT", "/v1/limits/ModelCalls", e.admin, obj{"id_format": "string", "kind": "concurrency", "burst": 10, "period": "30s"}).
				expect(t, http.StatusCreated).object(t)
			if leases["kind"] != "concurrency" || leases["calendar"] != nil || leases["time_zone"] != nil || leases["burst"] != float64(10) ||
				leases["count"] != float64(10) || leases["period"] != "30s" {
				t.Errorf("a concurrency limit: %v", leases)
			}
			rate := e.limit("Orders", "reg_id", 5, 5, "1h")
			if rate["kind"] != "rate" || rate["calendar"] != nil || rate["time_zone"] != nil || rate["period"] != "1h0m0s" {
				t.Errorf("a rate limit: %v", rate)
			}
			for name, want := range map[string]obj{"Exports": quota, "ModelCalls": leases, "Orders": rate} {
				got := e.do("GET", "/v1/limits/"+name, e.admin, nil).expect(t, http.StatusOK).object(t)
				for _, k := range []string{"kind", "calendar", "time_zone", "burst", "count", "period"} {
					if got[k] != want[k] {
						t.Errorf("GET %s: %s is %v, want %v", name, k, got[k], want[k])
					}
				}
			}

			before := e.rows()
			for _, c := range []struct {
				name string
				body obj
			}{
				{"Orders", obj{"id_format": "reg_id", "kind": "concurrency", "burst": 5, "period": "1h"}},
				{"Orders", obj{"id_format": "reg_id", "calendar": "day", "count": 5}},
				{"Exports", obj{"id_format": "string", "burst": 1000, "count": 1000, "period": "24h"}},
				{"ModelCalls", obj{"id_format": "string", "burst": 10, "count": 10, "period": "30s"}},
			} {
				p := e.do("PUT", "/v1/limits/"+c.name, e.admin, c.body).expect(t, http.StatusConflict).problem(t)
				if !strings.Contains(p.Detail, "kind cannot change") {
					t.Errorf("%s %v: %s", c.name, c.body, p.Detail)
				}
			}
			e.unchanged(before)
		})
	}
}

// TestQuotaIsNoKind: "quota", the kind a person would guess for a
// calendar quota, is refused on kind with how to make one, which then
// works as the message says; nothing is written before.
func TestQuotaIsNoKind(t *testing.T) {
	const how = `a calendar quota is kind "rate" with "calendar" set to hour, day, week, month or year`
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			before := e.rows()
			for _, body := range []obj{
				{"id_format": "string", "kind": "quota", "calendar": "day", "count": 10},
				{"id_format": "string", "kind": "quota", "count": 10},
				{"id_format": "string", "kind": "calendar", "calendar": "month", "count": 10},
			} {
				p := e.do("PUT", "/v1/limits/Exports", e.admin, body).expect(t, http.StatusUnprocessableEntity).problem(t)
				if msg := fieldErrors(p)["kind"]; !strings.Contains(msg, how) {
					t.Errorf("%v: kind: %q, want it to say %q", body, msg, how)
				}
			}
			e.unchanged(before)
			quota := e.do("PUT", "/v1/limits/Exports", e.admin, obj{"id_format": "string", "kind": "rate", "calendar": "day", "count": 10}).
				expect(t, http.StatusCreated).object(t)
			if quota["kind"] != "rate" || quota["calendar"] != "day" {
				t.Errorf("the quota made as the message says: %v", quota)
			}
		})
	}
}

// TestQuotaNewWindows: a quota's calendar or zone may change, and its
// usage then starts again in the new windows; a change that an override
// would not fit is refused naming calendar, and writes nothing.
func TestQuotaNewWindows(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			e.putLimit("Exports", obj{"id_format": "string", "calendar": "week", "count": 5})
			spent := e.decide("spend", e.admin, bucket("Exports", "acct", 3)).expect(t, http.StatusOK).object(t)
			if d := spent["decisions"].([]any)[0].(map[string]any); d["remaining"] != float64(2) {
				t.Fatalf("the spend: %v", spent)
			}
			e.putLimit("Exports", obj{"id_format": "string", "calendar": "week", "time_zone": "Pacific/Auckland", "count": 5})
			checked := e.decide("check", e.admin, bucket("Exports", "acct", 0)).expect(t, http.StatusOK).object(t)
			if d := checked["decisions"].([]any)[0].(map[string]any); d["remaining"] != float64(5) {
				t.Errorf("after a new zone, the bucket holds %v, want 5 (full)", d["remaining"])
			}

			e.override(obj{"limit": "Exports", "bucket_id": "big", "count": 1_000_000_000})
			before := e.rows()
			p := e.do("PUT", "/v1/limits/Exports", e.admin, obj{"id_format": "string", "calendar": "hour", "count": 5}).
				expect(t, http.StatusUnprocessableEntity).problem(t)
			wantFields(t, p, "calendar")
			e.unchanged(before)
			if got := e.do("GET", "/v1/limits/Exports", e.admin, nil).expect(t, http.StatusOK).object(t); got["calendar"] != "week" {
				t.Errorf("after a refused change: %v", got)
			}
		})
	}
}

// TestLimitHostileInput: what a limit of each sort refuses is a 422 naming
// the field, on both engines, and writes nothing.
func TestLimitHostileInput(t *testing.T) {
	quota := func(kv ...any) obj {
		o := obj{"id_format": "string", "calendar": "day", "count": 10}
		for i := 0; i < len(kv); i += 2 {
			o[kv[i].(string)] = kv[i+1]
		}
		return o
	}
	leases := func(kv ...any) obj {
		o := obj{"id_format": "string", "kind": "concurrency", "burst": 10, "period": "30s"}
		for i := 0; i < len(kv); i += 2 {
			o[kv[i].(string)] = kv[i+1]
		}
		return o
	}
	cases := []struct {
		name   string
		body   any
		status int
		fields []string
	}{
		{"zone path", quota("time_zone", "../../etc/passwd"), 422, []string{"time_zone"}},
		{"absolute zone path", quota("time_zone", "/etc/localtime"), 422, []string{"time_zone"}},
		{"host zone", quota("time_zone", "Local"), 422, []string{"time_zone"}},
		{"empty zone", quota("time_zone", ""), 422, []string{"time_zone"}},
		{"long zone", quota("time_zone", strings.Repeat("Europe/", 1500)), 422, []string{"time_zone"}},
		{"NUL in zone", quota("time_zone", "UTC\x00"), 422, []string{"time_zone"}},
		{"unknown zone", quota("time_zone", "Mars/Olympus_Mons"), 422, []string{"time_zone"}},
		{"invalid UTF-8 in zone", `{"id_format": "string", "calendar": "day", "count": 10, "time_zone": "Europe/Par` + "\xff" + `"}`, 400, []string{"time_zone"}},
		{"zone without calendar", obj{"id_format": "string", "burst": 1, "count": 1, "period": "1s", "time_zone": "UTC"}, 422, []string{"time_zone"}},
		{"unknown calendar", quota("calendar", "fortnight"), 422, []string{"calendar"}},
		{"empty calendar", quota("calendar", ""), 422, []string{"calendar"}},
		{"quota with a period", quota("period", "24h"), 422, []string{"period"}},
		{"quota burst", quota("burst", 11), 422, []string{"burst"}},
		{"huge quota", quota("count", int64(9223372036854775807)), 422, []string{"count"}},
		{"quota without count", obj{"id_format": "string", "calendar": "day"}, 422, []string{"count"}},
		{"calendar of leases", leases("calendar", "day"), 422, []string{"calendar"}},
		{"calendar and zone of leases", leases("calendar", "day", "time_zone", "UTC"), 422, []string{"calendar"}},
		{"leases count", leases("count", 9), 422, []string{"count"}},
		{"short lease", leases("period", "500ms"), 422, []string{"period"}},
		{"long lease", leases("period", "25h"), 422, []string{"period"}},
		{"leases without period", obj{"id_format": "string", "kind": "concurrency", "burst": 1}, 422, []string{"period"}},
		{"huge leases", leases("burst", int64(9223372036854775807)), 422, []string{"burst"}},
		{"unknown kind", obj{"id_format": "string", "kind": "leaky", "burst": 1, "count": 1, "period": "1s"}, 422, []string{"kind"}},
		{"empty kind", obj{"id_format": "string", "kind": "", "burst": 1, "count": 1, "period": "1s"}, 422, []string{"kind"}},
	}
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			e.putLimit("Exports", obj{"id_format": "string", "calendar": "day", "count": 10})
			before := e.rows()
			for _, c := range cases {
				for _, name := range []string{"New", "Exports"} {
					p := e.do("PUT", "/v1/limits/"+name, e.admin, c.body).expect(t, c.status).problem(t)
					for _, f := range c.fields {
						if _, ok := fieldErrors(p)[f]; !ok {
							t.Errorf("%s (%s): %+v does not name %s", c.name, name, p.Errors, f)
						}
					}
				}
			}
			e.unchanged(before)
		})
	}
}

// TestOverrideKinds: an override's parameters follow its limit's sort,
// with the same defaults as the limit's, on creation and in a patch.
func TestOverrideKinds(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			e.putLimit("Exports", obj{"id_format": "string", "calendar": "day", "count": 10})
			e.putLimit("ModelCalls", obj{"id_format": "string", "kind": "concurrency", "burst": 10, "period": "30s"})

			q := e.override(obj{"limit": "Exports", "bucket_id": "a", "count": 50})
			if q["burst"] != float64(50) || q["count"] != float64(50) || q["period"] != nil {
				t.Errorf("a quota's override: %v", q)
			}
			c := e.override(obj{"limit": "ModelCalls", "bucket_id": "a", "burst": 20, "period": "1m"})
			if c["burst"] != float64(20) || c["count"] != float64(20) || c["period"] != "1m0s" {
				t.Errorf("a concurrency limit's override: %v", c)
			}
			blocked := e.override(obj{"limit": "Exports", "bucket_id": "b", "count": 0})
			if blocked["burst"] != float64(0) || blocked["count"] != float64(0) {
				t.Errorf("a quota's blocking override: %v", blocked)
			}
			e.waitSource("Exports", "b", limiter.SourceOverride)
			res, err := e.limiter.Decide(t.Context(), limiter.Spend, []limiter.Request{{Limit: "Exports", BucketID: "b", Cost: 1}}, nil)
			if err != nil || res.Allowed || res.Decisions[0].Reason != limiter.ReasonBlocked {
				t.Errorf("a spend of the blocked bucket: %+v, %v", res, err)
			}

			// A patch keeps the rule: the burst of a quota follows its
			// count, the count of a concurrency limit its burst.
			q = e.do("PATCH", "/v1/overrides/"+q["id"].(string), e.admin, obj{"count": 70}).expect(t, http.StatusOK).object(t)
			if q["burst"] != float64(70) || q["count"] != float64(70) || q["period"] != nil {
				t.Errorf("a patched quota's override: %v", q)
			}
			c = e.do("PATCH", "/v1/overrides/"+c["id"].(string), e.admin, obj{"burst": 30}).expect(t, http.StatusOK).object(t)
			if c["burst"] != float64(30) || c["count"] != float64(30) || c["period"] != "1m0s" {
				t.Errorf("a patched concurrency limit's override: %v", c)
			}
			u := e.do("PATCH", "/v1/overrides/"+c["id"].(string), e.admin, obj{"unlimited": true}).expect(t, http.StatusOK).object(t)
			if u["burst"] != nil || u["period"] != nil {
				t.Errorf("an unlimited override: %v", u)
			}

			before := e.rows()
			for _, bad := range []struct {
				method, path string
				body         obj
				fields       []string
			}{
				{"POST", "/v1/overrides", obj{"limit": "Exports", "bucket_id": "x", "count": 5, "period": "24h"}, []string{"period"}},
				{"POST", "/v1/overrides", obj{"limit": "Exports", "bucket_id": "x", "count": 5, "burst": 6}, []string{"burst"}},
				{"POST", "/v1/overrides", obj{"limit": "Exports", "bucket_id": "x", "burst": 5}, []string{"count", "burst"}},
				{"POST", "/v1/overrides", obj{"limit": "Exports", "bucket_id": "x", "count": 1_000_000_000_000}, []string{"count"}},
				{"POST", "/v1/overrides", obj{"limit": "ModelCalls", "bucket_id": "x", "burst": 5}, []string{"period"}},
				{"POST", "/v1/overrides", obj{"limit": "ModelCalls", "bucket_id": "x", "burst": 5, "count": 4, "period": "1m"}, []string{"count"}},
				{"POST", "/v1/overrides", obj{"limit": "ModelCalls", "bucket_id": "x", "burst": 5, "period": "48h"}, []string{"period"}},
				{"PATCH", "/v1/overrides/" + q["id"].(string), obj{"period": "1h"}, []string{"period"}},
				{"PATCH", "/v1/overrides/" + q["id"].(string), obj{"burst": 3}, []string{"burst"}},
				// Ending unlimited needs what the limit's sort requires.
				{"PATCH", "/v1/overrides/" + u["id"].(string), obj{"unlimited": false, "burst": 3}, []string{"period"}},
			} {
				p := e.do(bad.method, bad.path, e.admin, bad.body).expect(t, http.StatusUnprocessableEntity).problem(t)
				wantFields(t, p, bad.fields...)
			}
			e.unchanged(before)
		})
	}
}

// TestRulesRefuseLeases: a rule cannot name a concurrency limit, on
// creation or in a patch: ShouldRateLimit cannot hold leases.
func TestRulesRefuseLeases(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			e.putLimit("Exports", obj{"id_format": "string", "calendar": "day", "count": 10})
			e.putLimit("ModelCalls", obj{"id_format": "string", "kind": "concurrency", "burst": 10, "period": "30s"})
			desc := []obj{{"key": "user"}}
			p := e.do("POST", "/v1/rules", e.admin, obj{"domain": "d", "descriptor": desc, "limit": "ModelCalls"}).
				expect(t, http.StatusUnprocessableEntity).problem(t)
			wantFields(t, p, "limit")
			r := e.do("POST", "/v1/rules", e.admin, obj{"domain": "d", "descriptor": desc, "limit": "Exports"}).
				expect(t, http.StatusCreated).object(t)
			p = e.do("PATCH", "/v1/rules/"+r["id"].(string), e.admin, obj{"limit": "ModelCalls"}).
				expect(t, http.StatusUnprocessableEntity).problem(t)
			wantFields(t, p, "limit")
		})
	}
}

// TestCalendarRace races two writes that depend on each other: a patch
// raising an override's count to what a monthly quota holds and an hourly
// one does not, and a PUT making the quota hourly. One of them may win,
// never both: the database must not hold an override that a replica's
// snapshot refuses.
func TestCalendarRace(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			e.putLimit("Exports", obj{"id_format": "string", "calendar": "month", "count": 10})
			id := e.override(obj{"limit": "Exports", "bucket_id": "a", "count": 10})["id"].(string)
			for round := range 10 {
				var wg sync.WaitGroup
				var patched, put int
				wg.Add(2)
				go func() {
					defer wg.Done()
					patched = e.do("PATCH", "/v1/overrides/"+id, e.admin, obj{"count": 1_000_000_000}).status
				}()
				go func() {
					defer wg.Done()
					put = e.do("PUT", "/v1/limits/Exports", e.admin, obj{"id_format": "string", "calendar": "hour", "count": 10}).status
				}()
				wg.Wait()
				if !(patched == http.StatusOK && put == http.StatusUnprocessableEntity || patched == http.StatusUnprocessableEntity && put == http.StatusOK) {
					t.Fatalf("round %d: the patch answered %d, the PUT %d; want one 200 and one 422", round, patched, put)
				}
				b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
				if _, err := e.db.Full(t.Context(), b.PutLimit, b.PutOverride); err != nil {
					t.Fatalf("round %d: the database holds what a snapshot refuses: %v", round, err)
				}
				// Back to the start: the override first, which the hourly
				// quota holds, then the monthly calendar.
				e.do("PATCH", "/v1/overrides/"+id, e.admin, obj{"count": 10}).expect(t, http.StatusOK)
				e.putLimit("Exports", obj{"id_format": "string", "calendar": "month", "count": 10})
			}
		})
	}
}
