package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ratelimitd/ratelimitd/auth"
	"github.com/ratelimitd/ratelimitd/db"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limitfile"
)

// cliActor is recorded as the actor of changes made from the command line,
// which needs no token: it already holds the database's credentials.
const cliActor = auth.CLIActor

// command parses the flags of a subcommand (extra registers its own), lets
// check refuse them and the arguments before anything is opened, so that a
// mistyped command touches no database, then opens the database, applying
// pending migrations when migrate is true and RATELIMIT_MIGRATE allows it.
func command(ctx context.Context, name string, args []string, getenv func(string) string, stderr io.Writer, migrate bool,
	extra func(*flag.FlagSet), check func(rest []string) error) (*db.DB, []string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if extra != nil {
		extra(fs)
	}
	cfg, rest, err := loadConfig(fs, args, getenv)
	if err != nil {
		return nil, nil, err
	}
	if err := check(rest); err != nil {
		return nil, nil, err
	}
	d, err := openDB(ctx, cfg, newLogger(stderr, cfg.LogLevel), migrate && cfg.Migrate)
	return d, rest, err
}

// migrate applies pending migrations ("up") or shows the version ("status").
func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	action := "up"
	d, _, err := command(ctx, "migrate", args, getenv, stderr, false, nil, func(rest []string) error {
		if len(rest) > 0 {
			action = rest[0]
		}
		if len(rest) > 1 || action != "up" && action != "status" {
			return fmt.Errorf("migrate: unknown action %q; want up or status", strings.Join(rest, " "))
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer d.Close()
	if action == "up" {
		if err := d.Migrate(ctx); err != nil {
			return err
		}
	}
	current, latest, err := d.MigrationVersion(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s database at migration %d of %d\n", d.Engine(), current, latest)
	return nil
}

// importFile imports a YAML file, all or nothing.
func importFile(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		kind, file string
		dryRun     bool
		data       []byte
		k          limitfile.Kind
	)
	d, _, err := command(ctx, "import", args, getenv, stderr, true, func(fs *flag.FlagSet) {
		fs.StringVar(&kind, "kind", "", "defaults, overrides or envoy; defaults or overrides told from the document when left out")
		fs.BoolVar(&dryRun, "dry-run", false, "validate and count, write nothing")
	}, func(rest []string) error {
		if len(rest) != 1 {
			return errors.New("import: give exactly one FILE, after the flags")
		}
		file = rest[0]
		var err error
		if data, err = os.ReadFile(file); err != nil {
			return err
		}
		if kind == "" {
			if k, err = limitfile.DetectKind(data); err != nil {
				return fmt.Errorf("import: %s: %w", file, err)
			}
			return nil
		}
		k, err = limitfile.ParseKind(kind)
		return err
	})
	if err != nil {
		return err
	}
	defer d.Close()
	counts, entryErrs, err := limitfile.Import(ctx, d, cliActor, k, data, dryRun)
	if err != nil {
		return err
	}
	for _, e := range entryErrs {
		fmt.Fprintf(stderr, "%s: %s\n", file, e)
	}
	if len(entryErrs) > 0 {
		return fmt.Errorf("import: %d bad entries; nothing was written", len(entryErrs))
	}
	verb := "imported"
	if dryRun {
		verb = "would import (dry run)"
	}
	fmt.Fprintf(stdout, "%s: %d created, %d updated, %d unchanged", verb, counts.Created, counts.Updated, counts.Unchanged)
	if len(counts.Removed) > 0 {
		fmt.Fprintf(stdout, ", %d removed", len(counts.Removed))
	}
	fmt.Fprintln(stdout)
	for _, r := range counts.Removed {
		fmt.Fprintf(stdout, "removed rule %s: domain %s, %s -> limit %s\n", r.ID, r.Domain, describeEntries(r.Descriptor), r.Limit)
	}
	for _, n := range counts.Notes {
		fmt.Fprintf(stdout, "note: %s\n", n)
	}
	return nil
}

// describeEntries writes a rule's descriptor as key=value pairs, a bare
// key for an entry that matches any value.
func describeEntries(entries []limiter.DescriptorEntry) string {
	parts := make([]string, len(entries))
	for i, e := range entries {
		parts[i] = e.Key
		if e.Value != "" {
			parts[i] += "=" + strconv.Quote(e.Value)
		}
	}
	return strings.Join(parts, " ")
}

// exportFile writes limits or overrides in the format import reads.
func exportFile(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var kind, out, domain string
	var k limitfile.Kind
	d, _, err := command(ctx, "export", args, getenv, stderr, false, func(fs *flag.FlagSet) {
		fs.StringVar(&kind, "kind", "", "defaults, overrides or envoy")
		fs.StringVar(&domain, "domain", "", "the domain whose rules kind envoy writes")
		fs.StringVar(&out, "o", "", "write to this file instead of standard output")
	}, func(rest []string) error {
		if len(rest) > 0 {
			return fmt.Errorf("export: unexpected arguments %q", strings.Join(rest, " "))
		}
		var err error
		if k, err = limitfile.ParseKind(kind); err != nil {
			return err
		}
		if (k == limitfile.Envoy) != (domain != "") {
			return errors.New("export: -domain goes with -kind envoy, and only with it")
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer d.Close()
	var data []byte
	if k == limitfile.Envoy {
		data, err = limitfile.ExportEnvoy(ctx, d, domain)
	} else {
		data, err = limitfile.Export(ctx, d, k)
	}
	if err != nil {
		return err
	}
	if out == "" {
		_, err = stdout.Write(data)
		return err
	}
	return os.WriteFile(out, data, 0o644)
}

// token manages API tokens: create prints the secret once.
func token(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("token: want create, list or revoke")
	}
	action, args := args[0], args[1:]
	var name, scope string
	var extra func(*flag.FlagSet)
	if action == "create" {
		extra = func(fs *flag.FlagSet) {
			fs.StringVar(&name, "name", "", "the token's name, recorded as the actor of its changes")
			fs.StringVar(&scope, "scope", "", "admin, support or decide")
		}
	}
	d, rest, err := command(ctx, "token "+action, args, getenv, stderr, true, extra, func(rest []string) error {
		if action != "revoke" && len(rest) > 0 {
			return fmt.Errorf("token %s: unexpected arguments %q", action, strings.Join(rest, " "))
		}
		switch action {
		case "create":
			if msg := auth.NameProblem(name); msg != "" {
				return fmt.Errorf("token create: -name %s", msg)
			}
			if !auth.Scope(scope).Valid() {
				return fmt.Errorf("token create: -scope must be admin, support or decide, got %q", scope)
			}
		case "list":
		case "revoke":
			if len(rest) != 1 {
				return errors.New("token revoke: give exactly one ID")
			}
		default:
			return fmt.Errorf("token: unknown action %q; want create, list or revoke", action)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer d.Close()
	switch action {
	case "create":
		secret, hash := auth.NewSecret()
		t, err := d.CreateToken(ctx, cliActor, auth.Token{Name: name, Scope: auth.Scope(scope), Hash: hash})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "created token %s (%s, %s); its secret, shown only now:\n%s\n", t.ID, t.Name, t.Scope, secret)
		return nil
	case "list":
		tokens, err := d.ListTokens(ctx)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tNAME\tSCOPE\tCREATED\tREVOKED")
		for _, t := range tokens {
			revoked := "-"
			if !t.RevokedAt.IsZero() {
				revoked = t.RevokedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, t.Scope, t.CreatedAt.Format(time.RFC3339), revoked)
		}
		return w.Flush()
	}
	// revoke, the one action left after the check.
	if err := d.RevokeToken(ctx, cliActor, rest[0]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "revoked token %s\n", rest[0])
	return nil
}
