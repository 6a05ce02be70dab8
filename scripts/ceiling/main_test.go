package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The bench compares the service with this answer byte for byte in size and
// checks "allowed" in it as in the service's.
func TestPostAnswersFixedSpendShapedJSON(t *testing.T) {
	srv := httptest.NewServer(handler())
	defer srv.Close()

	resp, err := http.Post(srv.URL+"/v1/spend", "application/json", strings.NewReader(`{"buckets":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || len(body) != 150 {
		t.Fatalf("got %d with %d bytes, want 200 with 150", resp.StatusCode, len(body))
	}
	var v struct{ Allowed bool }
	if err := json.Unmarshal(body, &v); err != nil || !v.Allowed {
		t.Fatalf("answer %s: allowed %v, err %v", body, v.Allowed, err)
	}
}

func TestOtherMethodsAreRefused(t *testing.T) {
	srv := httptest.NewServer(handler())
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/v1/spend")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d, want 405", resp.StatusCode)
	}
}
