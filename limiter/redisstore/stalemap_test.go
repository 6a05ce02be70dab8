package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
)

// TestStaleMapIgnoresCallersGone: a call its caller cancelled (the
// client went away) makes no master a suspect and reloads no map; a
// call that timed out, or lost its connection, still may come from a
// dead master.
func TestStaleMapIgnoresCallersGone(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.Canceled, false},
		{fmt.Errorf("redis evalsha: %w", context.Canceled), false},
		{context.DeadlineExceeded, true},
		{io.EOF, true},
		{errors.New("dial tcp: connection refused"), true},
		{nil, false},
	} {
		if got := staleMap(tc.err); got != tc.want {
			t.Errorf("staleMap(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
