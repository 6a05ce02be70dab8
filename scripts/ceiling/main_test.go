package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// The bench compares the service with this answer byte for byte in size and
// checks "allowed" in it as in the service's; the waiting ceiling answers
// the same, to every one of the requests it holds at once.
func TestPostAnswersFixedSpendShapedJSON(t *testing.T) {
	for _, wait := range []time.Duration{0, time.Millisecond} {
		t.Run(wait.String(), func(t *testing.T) {
			srv := httptest.NewServer(handler(wait))
			defer srv.Close()
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() { checkAnswer(t, srv.URL) })
			}
			wg.Wait()
		})
	}
}

func checkAnswer(t *testing.T, url string) {
	resp, err := http.Post(url+"/v1/spend", "application/json", strings.NewReader(`{"buckets":[]}`))
	if err != nil {
		t.Error(err)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
		return
	}
	if resp.StatusCode != http.StatusOK || len(body) != 150 {
		t.Errorf("got %d with %d bytes, want 200 with 150", resp.StatusCode, len(body))
		return
	}
	var v struct{ Allowed bool }
	if err := json.Unmarshal(body, &v); err != nil || !v.Allowed {
		t.Errorf("answer %s: allowed %v, err %v", body, v.Allowed, err)
	}
}

func TestOtherMethodsAreRefused(t *testing.T) {
	srv := httptest.NewServer(handler(0))
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
