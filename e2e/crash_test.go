//go:build linux

package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/client"
	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// TestKillDuringWrites kills the service with SIGKILL in the middle of a
// stream of admin writes, three times, restarting it each time. After each
// restart every acknowledged write must be there with its history entry,
// and every write under way at the kill must be there entirely or not at
// all: an override without its history entry, or an entry without its
// change, would be half-written.
//
// A write is under way at the kill when it started before the process was
// gone and ended (with an error: acknowledged ones are known) after the
// signal. Its transaction may have committed before the process died, its
// answer lost; that is the only uncertainty a client has, and it is
// allowed either outcome. Every other write that was not acknowledged
// (refused, or sent after the kill) must have left nothing.
func TestKillDuringWrites(t *testing.T) {
	t.Parallel()
	dbURL := testenv.Postgres(t)
	svc := newService(t, "ratelimitd", options{databaseURL: dbURL})
	const limit = "KillDuringWrites"
	putLimit(t, svc.admin(), limit, client.LimitPut{IDFormat: client.IDFormatString, Burst: ptr(int64(5)), Count: ptr(int64(5)), Period: ptr("1h")})
	token := createToken(t, svc.admin(), "writer", client.ScopeAdmin)

	var all []write
	var kills []struct{ signalled, gone time.Time }
	for round := range 3 {
		writes := startWrites(t, svc.client(token), limit, fmt.Sprintf("r%d-", round), 4, 5*time.Millisecond)
		start := writes.count()
		waitFor(t, 20*time.Second, "writes before the kill", func() bool { return writes.count() >= start+60 })
		signalled := time.Now()
		svc.kill()
		gone := time.Now()
		all = append(all, writes.halt()...)
		kills = append(kills, struct{ signalled, gone time.Time }{signalled, gone})
		restarted := time.Now()
		svc.start()
		t.Logf("measured: kill -9 during writes, round %d: ready again %v after the restart began", round, time.Since(restarted).Round(time.Millisecond))
	}
	v := verifyWrites(t, svc.admin(), dbURL, limit, "writer", all, func(w write) bool {
		for _, k := range kills {
			if w.start.Before(k.gone) && w.end.After(k.signalled) {
				return true
			}
		}
		return false
	})
	if v.uncertain == 0 {
		t.Errorf("no write was under way at any kill; the test proved nothing about them")
	}
	t.Logf("measured: kill -9 during writes, 3 rounds: %v", v)
}
