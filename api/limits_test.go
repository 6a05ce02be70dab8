package api_test

import (
	"net/http"
	"testing"

	"github.com/ratelimitd/ratelimitd/auth"
)

func TestLimits(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine.name, func(t *testing.T) {
			e := newEnv(t, engine.opts...)
			res := e.do("PUT", "/v1/limits/NewOrdersPerAccount", e.admin, obj{
				"id_format": "reg_id", "burst": 300, "count": 300, "period": "180m", "description": "orders",
			}).expect(t, http.StatusCreated)
			if loc := res.header.Get("Location"); loc != "/v1/limits/NewOrdersPerAccount" {
				t.Errorf("Location %q", loc)
			}
			l := res.object(t)
			// A name of Let's Encrypt's catalogue gets its number there.
			if l["period"] != "3h0m0s" || l["enum"] != float64(3) || l["override_count"] != float64(0) ||
				l["shadow"] != false || l["description"] != "orders" {
				t.Errorf("created %v", l)
			}

			// An explicit enum, and the next one assigned from 100 up.
			e.putLimit("Explicit", obj{"enum": 42, "id_format": "string", "burst": 1, "count": 1, "period": "1s"})
			if got := e.limit("First", "ip_address", 10, 10, "1m"); got["enum"] != float64(100) {
				t.Errorf("first assigned enum %v", got["enum"])
			}
			if got := e.limit("Second", "ip_address", 10, 10, "1m"); got["enum"] != float64(101) {
				t.Errorf("second enum %v", got["enum"])
			}

			// Update: 200, the enum kept, a missing description cleared.
			res = e.do("PUT", "/v1/limits/NewOrdersPerAccount", e.admin, obj{
				"name": "NewOrdersPerAccount", "id_format": "reg_id", "burst": 600, "count": 300, "period": "3h", "shadow": true,
			}).expect(t, http.StatusOK)
			l = res.object(t)
			if l["burst"] != float64(600) || l["enum"] != float64(3) || l["description"] != "" || l["shadow"] != true {
				t.Errorf("updated %v", l)
			}
			// Another enum is a conflict.
			e.do("PUT", "/v1/limits/NewOrdersPerAccount", e.admin, obj{
				"enum": 7, "id_format": "reg_id", "burst": 600, "count": 300, "period": "3h",
			}).expect(t, http.StatusConflict)
			// A name in the body must be the path's.
			p := e.do("PUT", "/v1/limits/NewOrdersPerAccount", e.admin, obj{
				"name": "Other", "id_format": "reg_id", "burst": 600, "count": 300, "period": "3h",
			}).expect(t, http.StatusUnprocessableEntity).problem(t)
			wantFields(t, p, "name")

			e.override(obj{"limit": "NewOrdersPerAccount", "bucket_id": "12", "burst": 1, "count": 1, "period": "1s"})
			e.override(obj{"limit": "NewOrdersPerAccount", "bucket_id": "13", "unlimited": true})

			one := e.do("GET", "/v1/limits/NewOrdersPerAccount", e.admin, nil).expect(t, http.StatusOK).object(t)
			if one["override_count"] != float64(2) {
				t.Errorf("override_count %v", one["override_count"])
			}
			var list struct {
				Limits []obj `json:"limits"`
			}
			e.do("GET", "/v1/limits", e.token("reader", auth.Decide), nil).expect(t, http.StatusOK).json(t, &list)
			var names []any
			for _, l := range list.Limits {
				names = append(names, l["name"])
				if l["name"] == "NewOrdersPerAccount" && l["override_count"] != float64(2) {
					t.Errorf("listed override_count %v", l["override_count"])
				}
			}
			if len(names) != 4 || names[0] != "Explicit" || names[1] != "First" || names[2] != "NewOrdersPerAccount" || names[3] != "Second" {
				t.Errorf("names %v", names)
			}

			// The id format cannot change while overrides exist; the
			// parameters can, and the count answers too.
			e.do("PUT", "/v1/limits/NewOrdersPerAccount", e.admin, obj{
				"id_format": "string", "burst": 600, "count": 300, "period": "3h",
			}).expect(t, http.StatusConflict)
			upd := e.putLimit("NewOrdersPerAccount", obj{"id_format": "reg_id", "burst": 10, "count": 300, "period": "3h"})
			if upd["override_count"] != float64(2) {
				t.Errorf("override_count after update %v", upd["override_count"])
			}
			e.do("DELETE", "/v1/limits/NewOrdersPerAccount", e.admin, nil).expect(t, http.StatusConflict)

			e.do("DELETE", "/v1/limits/Second", e.admin, nil).expect(t, http.StatusNoContent)
			e.do("GET", "/v1/limits/Second", e.admin, nil).expect(t, http.StatusNotFound).problem(t)
			e.do("DELETE", "/v1/limits/Second", e.admin, nil).expect(t, http.StatusNotFound)
			// A path that is no limit name is refused as PUT refuses it,
			// 422 naming name, on every method, rather than looked up.
			for _, method := range []string{"GET", "DELETE"} {
				for _, path := range []string{"/v1/limits/1bad", "/v1/limits/bad%20name"} {
					wantFields(t, e.do(method, path, e.admin, nil).expect(t, http.StatusUnprocessableEntity).problem(t), "name")
				}
			}
		})
	}
}
