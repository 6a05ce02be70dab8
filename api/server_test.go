package api

import (
	"math"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
)

// An answer that cannot be encoded must not leave a success status behind:
// the error goes to the error handler, which can still answer 500.
func TestWriteJSONEncodesBeforeTheStatus(t *testing.T) {
	rec := httptest.NewRecorder()
	c := echo.New().NewContext(httptest.NewRequest(http.MethodGet, "/", nil), rec)
	if err := writeJSON(c, http.StatusOK, math.Inf(1)); err == nil {
		t.Fatal("encoding +Inf succeeded")
	}
	if c.Response().Committed || rec.Body.Len() > 0 {
		t.Fatalf("status %d and %q went out before the encoding failed", rec.Code, rec.Body)
	}
}
