package main

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/testenv"
)

// cliRun runs one command line in this process and returns what it wrote
// on stdout and stderr.
func cliRun(env map[string]string, args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	err = run(context.Background(), args, getenv(env), &out, &errOut)
	return out.String(), errOut.String(), err
}

// TestBusyPortChangesNothing starts serve with one of its listeners on a
// busy port: the error names the listener and the setting that moves it
// (and, for the optional ones, how to turn it off), and the start writes
// nothing, neither a database nor a token, on SQLite and on Postgres.
func TestBusyPortChangesNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		env  string
		want []string
	}{
		{"RATELIMIT_HTTP_ADDR", []string{"the HTTP listener", "-http-addr", "RATELIMIT_HTTP_ADDR", busy.Addr().String(), "address already in use"}},
		{"RATELIMIT_GRPC_ADDR", []string{"the Envoy gRPC listener", "-grpc-addr", "RATELIMIT_GRPC_ADDR", "-grpc-addr= ", busy.Addr().String()}},
		{"RATELIMIT_DEBUG_ADDR", []string{"the debug listener", "-debug-addr", "RATELIMIT_DEBUG_ADDR", "empty", busy.Addr().String()}},
	} {
		file := filepath.Join(t.TempDir(), "rl.db")
		engines := []struct{ name, url string }{{"sqlite", "sqlite:" + file}}
		if tc.env == "RATELIMIT_GRPC_ADDR" {
			engines = append(engines, struct{ name, url string }{"postgres", testenv.Postgres(t)})
		}
		for _, e := range engines {
			env := map[string]string{"RATELIMIT_DATABASE_URL": e.url, "RATELIMIT_HTTP_ADDR": "127.0.0.1:0", "RATELIMIT_GRPC_ADDR": "127.0.0.1:0"}
			env[tc.env] = busy.Addr().String()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			var out, errOut bytes.Buffer
			err := run(ctx, []string{"serve"}, getenv(env), &out, &errOut)
			cancel()
			if err == nil {
				t.Fatalf("%s on a busy port (%s): serve ran", tc.env, e.name)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s busy (%s): the error does not say %q:\n%v", tc.env, e.name, w, err)
				}
			}
			if strings.Contains(out.String(), "rlt_") || strings.Contains(out.String(), "token") {
				t.Errorf("%s busy (%s): a token was made or named:\n%s", tc.env, e.name, out.String())
			}
			switch e.name {
			case "sqlite":
				if entries, _ := os.ReadDir(filepath.Dir(file)); len(entries) > 0 {
					t.Errorf("%s busy: the failed start left %v", tc.env, entries)
				}
			case "postgres":
				// The database was neither migrated nor given a token.
				status, log, err := cliRun(map[string]string{"RATELIMIT_DATABASE_URL": e.url}, "migrate", "status")
				if err != nil || !strings.Contains(status, "at migration 0 of") {
					t.Errorf("%s busy (postgres): after the failed start, migrate status = %q, %v\n%s", tc.env, status, err, log)
				}
			}
		}
	}
}

// TestSecondStartNamesTheToken: the first start prints the admin token's
// secret and the database's absolute path; a second start, which makes no
// token, names the one that exists, the command that makes another, and
// the database again.
func TestSecondStartNamesTheToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "data", "rl.db")
	if err := os.Mkdir(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	// A relative path, as a newcomer types it, is shown absolute.
	t.Chdir(dir)
	env := func() map[string]string { return map[string]string{"RATELIMIT_DATABASE_URL": "sqlite:data/rl.db"} }
	first := startServe(t, env())
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	id := regexp.MustCompile(`admin token was created \(id (\S+)\)`).FindStringSubmatch(first.stdout.String())
	if id == nil || !strings.Contains(first.stdout.String(), "rlt_") {
		t.Fatalf("the first start printed no token:\n%s", first.stdout.String())
	}
	for _, want := range []string{file, "ratelimitd token create -name NAME -scope admin"} {
		if !strings.Contains(first.stdout.String(), want) {
			t.Errorf("the first start does not say %q:\n%s", want, first.stdout.String())
		}
	}
	second := startServe(t, env())
	out := second.stdout.String()
	if strings.Contains(out, "rlt_") {
		t.Errorf("the second start printed a secret:\n%s", out)
	}
	for _, want := range []string{"initial-admin", id[1], "ratelimitd token create -name NAME -scope admin -database-url sqlite:" + file, "the SQLite database " + file} {
		if !strings.Contains(out, want) {
			t.Errorf("the second start does not say %q:\n%s", want, out)
		}
	}
	if err := second.stop(); err != nil {
		t.Fatal(err)
	}

	// With the admin token revoked, a start says none is live.
	if out, log, err := cliRun(env(), "token", "revoke", id[1]); err != nil {
		t.Fatalf("revoking the admin token: %v\n%s%s", err, out, log)
	}
	third := startServe(t, env()).stdout.String()
	if !strings.Contains(third, "No admin token is live") || !strings.Contains(third, "ratelimitd token create -name NAME -scope admin") {
		t.Errorf("a start without a live admin token does not say so:\n%s", third)
	}
}

// TestCommandsRefuseANewDatabase runs the commands in an empty directory
// with no database named: every one but serve and migrate up refuses,
// says which database it would have used and how to name the right one,
// and creates nothing. -create makes the file; each command says which
// database it used, a Postgres one without its password.
func TestCommandsRefuseANewDatabase(t *testing.T) {
	files := t.TempDir()
	defaults := filepath.Join(files, "defaults.yaml")
	if err := os.WriteFile(defaults, []byte("Logins:\n  burst: 5\n  count: 5\n  period: 1m\n  id_format: string\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Chdir(dir)
	abs := filepath.Join(dir, "ratelimitd.db")
	env := map[string]string{}
	for _, args := range [][]string{
		{"token", "create", "-name", "ops", "-scope", "support"}, {"token", "list"}, {"token", "revoke", "01M856PZVA5W0TNXX731393GR7"},
		{"import", defaults}, {"import", "-dry-run", defaults}, {"export", "-kind", "defaults"}, {"migrate", "status"},
	} {
		out, log, err := cliRun(env, args...)
		if err == nil {
			t.Errorf("%q in an empty directory succeeded:\n%s%s", args, out, log)
			continue
		}
		want := []string{abs, `"sqlite:ratelimitd.db"`, "-database-url", "RATELIMIT_DATABASE_URL", "postgres://"}
		// A dry run creates no database: -create would not help it.
		if args[0] == "import" && args[1] != "-dry-run" || args[1] == "create" {
			want = append(want, "-create")
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: the error does not say %q:\n%v", args, w, err)
			}
		}
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			t.Fatalf("%q created %v", args, entries)
		}
	}

	out, log, err := cliRun(env, "token", "create", "-create", "-name", "ops", "-scope", "support")
	if err != nil || !strings.Contains(out, "rlt_") {
		t.Fatalf("token create -create: %v\n%s%s", err, out, log)
	}
	for _, args := range [][]string{{"token", "create", "-create", "-name", "ops2", "-scope", "support"}, {"token", "list"}, {"migrate", "status"}} {
		out, log, err := cliRun(env, args...)
		if err != nil || !strings.Contains(log, "Using the SQLite database "+abs) {
			t.Errorf("%q does not say which database it used: %v\n%s%s", args, err, out, log)
		}
	}

	pg, err := url.Parse(testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	// The test server trusts the user: the password is there to be hidden.
	pg.User = url.UserPassword(pg.User.Username(), "hunter2")
	out, log, err = cliRun(map[string]string{}, "migrate", "-database-url", pg.String())
	if err != nil || !strings.Contains(log, "Using the Postgres database postgres://") || !strings.Contains(log, pg.Host) ||
		strings.Contains(out+log, "hunter2") {
		t.Errorf("migrate on Postgres: %v\n%s%s", err, out, log)
	}
}

// TestCommandsHostileInput gives the commands NUL, invalid UTF-8 and huge
// arguments where names, paths and actions go: each is an error, and
// nothing is created.
func TestCommandsHostileInput(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	huge := strings.Repeat("x", 1<<20)
	for _, args := range [][]string{
		{"token", "list", "-database-url", "sqlite:x.db\x00y"},
		{"migrate", "-database-url", "sqlite:x.db\x00y"},
		{"token", "create", "-create", "-name", "a\x00b", "-scope", "admin"},
		{"token", "create", "-create", "-name", "a\xffb", "-scope", "admin"},
		{"token", "create", "-create", "-name", huge, "-scope", "admin"},
		{"token", "create", "-create", "-name", "ops", "-scope", "admin\x00"},
		{"token", "revoke", "\x00"},
		{"import", "-create", "a\x00b"},
		{"import", "-create", "-kind", "defaults\x00", "a.yaml"},
		{"export", "-kind", huge},
		{"migrate", "status\x00"},
		{"token\x00", "list"},
		{"help", "token\x00"},
		{huge},
	} {
		if out, _, err := cliRun(map[string]string{}, args...); err == nil {
			t.Errorf("%.80q succeeded: %s", args, out)
		}
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			t.Fatalf("%.80q created %v", args, entries)
		}
	}
}

// TestFlagsOnBothSides gives the flags of every command that takes
// positional arguments before them and after them; an argument too many
// or an unknown flag is an error that shows the command's usage.
func TestFlagsOnBothSides(t *testing.T) {
	dir := t.TempDir()
	dbURL := "sqlite:" + filepath.Join(dir, "rl.db")
	defaults := filepath.Join(dir, "defaults.yaml")
	if err := os.WriteFile(defaults, []byte("Logins:\n  burst: 5\n  count: 5\n  period: 1m\n  id_format: string\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"RATELIMIT_LOG_LEVEL": "warn"}
	must := func(want string, args ...string) string {
		t.Helper()
		out, log, err := cliRun(env, args...)
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("%q: %v, want %q in\n%s%s", args, err, want, out, log)
		}
		return out
	}
	must("at migration", "migrate", "-database-url", dbURL)
	must("at migration", "migrate", "status", "-database-url", dbURL)
	must("at migration", "migrate", "-database-url", dbURL, "status")
	must("at migration", "migrate", "up", "-database-url="+dbURL)
	must("would import", "import", defaults, "-kind", "defaults", "-database-url", dbURL, "-dry-run")
	must("would import", "import", "-dry-run", defaults, "-database-url", dbURL)
	must("1 created", "import", "-database-url", dbURL, defaults, "-kind", "defaults")
	// An Envoy file merged into its domain, and the same file again,
	// refused with its line: the domain has its descriptor.
	envoy := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(envoy, []byte("domain: edge\ndescriptors:\n  - key: k1\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	must("2 created", "import", "-kind", "envoy", "-merge", envoy, "-database-url", dbURL)
	if out, log, err := cliRun(env, "import", "-kind", "envoy", "-merge", envoy, "-database-url", dbURL); err == nil ||
		!strings.Contains(log, envoy+": line 3") || !strings.Contains(log, "has this descriptor already") {
		t.Errorf("a second merge of one file: %v\n%s%s", err, out, log)
	}
	must("Logins", "export", "-kind", "defaults", "-database-url", dbURL)
	tokenID := regexp.MustCompile(`created token (\S+)`)
	a := tokenID.FindStringSubmatch(must("created token", "token", "create", "-name", "a", "-database-url", dbURL, "-scope", "admin"))
	b := tokenID.FindStringSubmatch(must("created token", "token", "create", "-database-url", dbURL, "-scope", "admin", "-name", "b"))
	must("revoked token "+a[1], "token", "revoke", a[1], "-database-url", dbURL)
	must("revoked token "+b[1], "token", "revoke", "-database-url", dbURL, b[1])
	must(b[1], "token", "list", "-database-url", dbURL)

	for _, tc := range []struct {
		args  []string
		usage string
	}{
		{[]string{"token", "revoke", "X", "Y", "-database-url", dbURL}, "token revoke ID"},
		{[]string{"token", "revoke", "-database-url", dbURL}, "token revoke ID"},
		{[]string{"token", "list", "extra", "-database-url", dbURL}, "token list"},
		{[]string{"token", "create", "-name", "c", "-scope", "admin", "extra", "-database-url", dbURL}, "token create -name NAME"},
		{[]string{"token", "list", "-frobnicate"}, "token list"},
		{[]string{"migrate", "up", "extra", "-database-url", dbURL}, "migrate [up|status]"},
		{[]string{"migrate", "sideways", "-database-url", dbURL}, "migrate [up|status]"},
		{[]string{"import", defaults, defaults, "-database-url", dbURL}, "import [-kind defaults|overrides|envoy]"},
		{[]string{"import", "-database-url", dbURL}, "import [-kind defaults|overrides|envoy]"},
		{[]string{"import", "-merge", defaults, "-database-url", dbURL}, "import [-kind defaults|overrides|envoy] [-merge]"},
		{[]string{"export", "-kind", "defaults", "extra", "-database-url", dbURL}, "export -kind defaults|overrides|envoy"},
		{[]string{"serve", "extra"}, "usage: ratelimitd serve"},
		{[]string{"version", "extra"}, "usage: ratelimitd version"},
		{[]string{"token", "frobnicate"}, "ratelimitd token revoke ID"},
		{[]string{"token"}, "ratelimitd token revoke ID"},
	} {
		out, _, err := cliRun(env, tc.args...)
		if err == nil || !strings.Contains(err.Error(), "usage: ") || !strings.Contains(err.Error(), tc.usage) {
			t.Errorf("%q: %v, want an error with the usage %q\n%s", tc.args, err, tc.usage, out)
		}
	}
	if out := must("Logins", "export", "-kind", "defaults", "-database-url", dbURL); strings.Contains(out, "extra") {
		t.Errorf("a refused command wrote: %s", out)
	}
}

// TestHelp asks every command and action for help in each way a user
// does: usage on stdout, exit status 0, the command's own flags before
// the settings, which only serve lists in full.
func TestHelp(t *testing.T) {
	own := map[string][]string{
		"serve":        nil,
		"migrate":      {"up", "status"},
		"import":       {"-kind", "defaults|overrides|envoy", "-merge", "-dry-run", "-create", "FILE"},
		"export":       {"-kind", "defaults|overrides|envoy", "-domain", "-o"},
		"token create": {"-name", "-scope", "admin|support|decide", "-create"},
		"token list":   nil,
		"token revoke": {"ID"},
		"version":      nil,
	}
	for name, flags := range own {
		words := strings.Fields(name)
		for _, args := range [][]string{append(words, "-h"), append(words, "--help"), append(words, "-help"), append([]string{"help"}, words...)} {
			out, log, err := cliRun(map[string]string{}, args...)
			if err != nil || log != "" || !strings.HasPrefix(out, "usage: ratelimitd "+name) {
				t.Errorf("%q: %v, stderr %q, stdout:\n%s", args, err, log, out)
				continue
			}
			shared := strings.Index(out, "-database-url")
			for _, f := range flags {
				if at := strings.Index(out, f); at < 0 || shared >= 0 && at > shared {
					t.Errorf("%q does not show %s before the settings:\n%s", args, f, out)
				}
			}
			switch name {
			case "serve":
				for _, s := range settings {
					if !strings.Contains(out, "-"+s.flag) || !strings.Contains(out, s.env) {
						t.Errorf("serve -h does not list %s:\n%s", s.env, out)
					}
				}
			case "version":
				if shared >= 0 {
					t.Errorf("version -h lists settings it does not read:\n%s", out)
				}
			default:
				if shared < 0 || !strings.Contains(out, "ratelimitd serve -h") || strings.Contains(out, "-grpc-tls-cert") {
					t.Errorf("%q should list the database setting and refer to serve -h for the rest:\n%s", args, out)
				}
			}
		}
	}
	for _, args := range [][]string{{"token", "-h"}, {"token", "--help"}, {"help", "token"}} {
		out, _, err := cliRun(map[string]string{}, args...)
		if err != nil || !strings.HasPrefix(out, "usage: ratelimitd token create") ||
			!strings.Contains(out, "ratelimitd token list") || !strings.Contains(out, "ratelimitd token revoke ID") {
			t.Errorf("%q: %v\n%s", args, err, out)
		}
	}
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}, {"-help"}} {
		out, _, err := cliRun(map[string]string{}, args...)
		if err != nil {
			t.Errorf("%q: %v", args, err)
		}
		for _, want := range []string{"serve", "migrate [up|status]", "import [-kind defaults|overrides|envoy]", "export -kind defaults|overrides|envoy",
			"token create -name NAME -scope admin|support|decide", "token list", "token revoke ID", "version", "help [COMMAND]"} {
			if !strings.Contains(out, "\n  "+want) {
				t.Errorf("%q does not list %q:\n%s", args, want, out)
			}
		}
	}
	if _, _, err := cliRun(map[string]string{}); err == nil || !strings.Contains(err.Error(), "token revoke ID") {
		t.Errorf("no command: %v, want the list of commands", err)
	}
	if _, _, err := cliRun(map[string]string{}, "help", "frobnicate"); err == nil {
		t.Error("help of an unknown command succeeded")
	}
}

// TestImportDryRunChangesNothing: a dry run writes nothing, the schema
// included: it neither creates a SQLite file, -create or not, nor applies
// the migrations of a database that lacks them; it says to migrate first.
func TestImportDryRunChangesNothing(t *testing.T) {
	dir := t.TempDir()
	defaults := filepath.Join(dir, "defaults.yaml")
	if err := os.WriteFile(defaults, []byte("Logins:\n  burst: 5\n  count: 5\n  period: 1m\n  id_format: string\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"RATELIMIT_LOG_LEVEL": "warn"}
	fresh := filepath.Join(dir, "fresh.db")
	for _, args := range [][]string{
		{"import", "-dry-run", "-create", defaults, "-database-url", "sqlite:" + fresh},
		{"import", "-dry-run", defaults, "-database-url", "sqlite:" + fresh},
	} {
		out, log, err := cliRun(env, args...)
		if err == nil {
			t.Errorf("%q on no database succeeded:\n%s%s", args, out, log)
		}
		if _, serr := os.Stat(fresh); serr == nil {
			t.Fatalf("%q created %s: %v\n%s%s", args, fresh, err, out, log)
		}
	}

	// A database that exists but lacks its migrations keeps lacking them.
	old := filepath.Join(dir, "old.db")
	if err := os.WriteFile(old, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out, log, err := cliRun(env, "import", "-dry-run", defaults, "-database-url", "sqlite:"+old)
	if err == nil || !strings.Contains(err.Error(), "migrate") {
		t.Errorf("a dry run on a database without its migrations: %v, want an error saying to migrate\n%s%s", err, out, log)
	}
	if out, log, err := cliRun(env, "migrate", "status", "-database-url", "sqlite:"+old); err != nil || !strings.Contains(out, "at migration 0 of") {
		t.Errorf("after the dry run: %v\n%s%s", err, out, log)
	}

	// Once migrated, a dry run counts and writes nothing.
	if out, log, err := cliRun(env, "migrate", "-database-url", "sqlite:"+old); err != nil {
		t.Fatalf("migrate: %v\n%s%s", err, out, log)
	}
	for range 2 {
		if out, log, err := cliRun(env, "import", "-dry-run", defaults, "-database-url", "sqlite:"+old); err != nil || !strings.Contains(out, "would import (dry run): 1 created") {
			t.Errorf("a dry run: %v\n%s%s", err, out, log)
		}
	}
}
