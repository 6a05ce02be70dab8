// Package e2e holds the end-to-end tests of ratelimitd: they build the
// service binary, run it as separate processes against a fresh Postgres
// database and a Redis server, drive them through the generated client
// (package client), and inject faults from outside: a private
// redis-server killed or stopped with SIGSTOP, Postgres cut off or stalled
// by a TCP proxy, the service killed with SIGKILL in the middle of writes,
// three processes sharing one Redis and one database.
//
// The package has tests only, for Linux. They need Postgres, Redis and the
// redis-server binary, as internal/testenv finds them; under CI=true a
// missing one fails the tests instead of skipping them. Each test logs the
// figures it measured (latencies during a fault, recovery times, delays
// between processes) with t.Logf under the prefix "measured:", which `go
// test -v` shows; no timing decides whether a test passes, beyond generous
// bounds that only a hang would exceed.
//
// RATELIMIT_E2E_RACE=true builds the service with -race, so that a data
// race in a service process fails the test.
package e2e
