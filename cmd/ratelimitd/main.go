// Command ratelimitd is the rate-limit service and its administration
// tools:
//
//	ratelimitd serve                      run the service
//	ratelimitd migrate [up|status]        apply or show database migrations
//	ratelimitd import [-kind K] [-dry-run] [-create] FILE
//	ratelimitd export -kind K [-domain D] [-o FILE]
//	ratelimitd token create -name N -scope S [-create] | list | revoke ID
//	ratelimitd version
//	ratelimitd help [COMMAND]
//
// Every command reads the RATELIMIT_* variables; flags override them.
// cli.go holds the table of commands that run dispatches on and help
// prints.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/gcfloor"
)

// gcHeadroom is the allocation a collection leaves room for, unless GOGC
// is set (docs/configuration.md): at most this much more memory for a small
// heap, and nothing for one beyond it.
const gcHeadroom = 64 << 20

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// go-redis prints a plain-text line for every failed dial into what is
	// a JSON log; the limiter logs a store outage once, when it begins.
	redis.SetLogger(quiet{})
	// A replica's heap is small and each decision allocates a little: at
	// Go's default the collector would run dozens of times a second. The
	// floor lasts as long as the process.
	gcfloor.Keep(os.Getenv, gcHeadroom)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], environ, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ratelimitd:", err)
		os.Exit(2)
	}
}

// environ reads a variable, reporting one set to the empty string as
// setEmpty, so that a setting whose empty value means off can tell it from
// one not set at all.
func environ(key string) string {
	if v, ok := os.LookupEnv(key); ok && v == "" {
		return setEmpty
	}
	return os.Getenv(key)
}

// quiet discards go-redis's own log lines.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// run is the whole program, so that a test can run it on port 0: args
// without the program name, the environment through getenv, what the user
// should read on stdout and the JSON log on stderr.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return dispatch(ctx, invocation{now: time.Now, getenv: getenv, stdout: stdout, stderr: stderr}, args)
}
