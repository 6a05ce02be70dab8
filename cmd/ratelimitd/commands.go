package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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

// creation says whether a command may create a SQLite file that does not
// exist. serve and migrate up may; the others change or read what a
// service has, which a new file cannot be: the file named is then not the
// service's (a forgotten RATELIMIT_DATABASE_URL, another directory), and
// a token or a limit written there would reach no service.
type creation int

const (
	// mustExist: the command has no use for a new, empty database.
	mustExist creation = iota
	// createWithFlag: the command makes one with -create, which was not given.
	createWithFlag
	// mayCreate: serve, migrate up, or -create given.
	mayCreate
)

// createFlag registers -create, for the commands that may make a new
// database worth having.
func createFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("create", false, "create the SQLite database when its file does not exist; without it the command refuses, as a new file is not the service's database")
}

// creationOf is the creation of a command with -create.
func creationOf(create bool) creation {
	if create {
		return mayCreate
	}
	return createWithFlag
}

// database opens the database the settings name and says on stderr which
// it is (stdout is for what scripts read: an export, a secret). Pending
// migrations are applied when migrate is true and RATELIMIT_MIGRATE allows.
func (inv *invocation) database(ctx context.Context, c creation, migrate bool) (*db.DB, error) {
	if err := missingDatabase(inv.cfg.DatabaseURL, c); err != nil {
		return nil, err
	}
	fmt.Fprintf(inv.stderr, "Using %s.\n", describeDatabase(inv.cfg.DatabaseURL))
	return openDB(ctx, inv.cfg, newLogger(inv.stderr, inv.cfg.LogLevel), migrate && inv.cfg.Migrate)
}

// missingDatabase refuses a SQLite file that does not exist unless the
// command may create it, saying which database it would have used and how
// to name the right one.
func missingDatabase(url string, c creation) error {
	if c == mayCreate || !newSQLite(url) {
		return nil
	}
	path := strings.TrimPrefix(url, "sqlite:")
	var b strings.Builder
	fmt.Fprintf(&b, "there is no database at %s", absPath(path))
	if url == defaultOf("RATELIMIT_DATABASE_URL") {
		fmt.Fprintf(&b, ": neither -database-url nor RATELIMIT_DATABASE_URL names one, so the default %q was tried", url)
	}
	b.WriteString(`. Name the service's database with -database-url or RATELIMIT_DATABASE_URL ("postgres://..." or "sqlite:PATH")`)
	if c == createWithFlag {
		b.WriteString(", or give -create to make a new SQLite database there")
	}
	return errors.New(b.String())
}

// newSQLite reports whether url names a SQLite file that does not exist,
// which opening it creates. Another error is for opening it to report.
func newSQLite(url string) bool {
	path, ok := strings.CutPrefix(url, "sqlite:")
	if !ok {
		return false
	}
	_, err := os.Stat(path)
	return errors.Is(err, fs.ErrNotExist)
}

// describeDatabase names a database for people: its engine, and the
// absolute path of a SQLite file or a Postgres URL without its password.
func describeDatabase(url string) string {
	if path, ok := strings.CutPrefix(url, "sqlite:"); ok {
		return "the SQLite database " + absPath(path)
	}
	return "the Postgres database " + maskURL(url)
}

// absPath is path made absolute, or path when the working directory is
// unknown.
func absPath(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

// defaultOf returns the default of the setting of the variable env.
func defaultOf(env string) string {
	for _, s := range settings {
		if s.env == env {
			return s.def
		}
	}
	return ""
}

// migrate applies pending migrations ("up") or shows the version ("status").
func migrate(ctx context.Context, inv *invocation) error {
	action := "up"
	switch len(inv.args) {
	case 0:
	case 1:
		action = inv.args[0]
	default:
		return misusef("unexpected argument %q", inv.args[1])
	}
	c := mustExist
	switch action {
	case "up":
		c = mayCreate
	case "status":
	default:
		return misusef("unknown action %q; want up or status", action)
	}
	d, err := inv.database(ctx, c, false)
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
	fmt.Fprintf(inv.stdout, "%s database at migration %d of %d\n", d.Engine(), current, latest)
	return nil
}

// importFile imports a YAML file, all or nothing. A mistyped command (a
// bad -kind, a missing file) is refused before any database is opened.
func importFile(ctx context.Context, inv *invocation, kind string, opts limitfile.ImportOptions, create bool) error {
	if len(inv.args) != 1 {
		return misusef("give exactly one FILE, got %d arguments", len(inv.args))
	}
	if opts.Merge && kind != string(limitfile.Envoy) {
		return misusef("-merge is only for -kind envoy")
	}
	file := inv.args[0]
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var k limitfile.Kind
	if kind == "" {
		if k, err = limitfile.DetectKind(data); err != nil {
			return fmt.Errorf("import: %s: %w", file, err)
		}
	} else if k, err = limitfile.ParseKind(kind); err != nil {
		return misuse{err}
	}
	c, migrate := creationOf(create), true
	if opts.DryRun {
		// A dry run writes nothing: no new SQLite file, whatever -create
		// says, and no migration.
		c, migrate = mustExist, false
	}
	d, err := inv.database(ctx, c, migrate)
	if err != nil {
		return err
	}
	defer d.Close()
	if opts.DryRun {
		if err := migrated(ctx, d); err != nil {
			return err
		}
	}
	counts, entryErrs, err := limitfile.Import(ctx, d, cliActor, k, data, opts)
	if err != nil {
		return err
	}
	for _, e := range entryErrs {
		fmt.Fprintf(inv.stderr, "%s: %s\n", file, e)
	}
	if len(entryErrs) > 0 {
		return fmt.Errorf("import: %d bad entries; nothing was written", len(entryErrs))
	}
	verb := "imported"
	if opts.DryRun {
		verb = "would import (dry run)"
	}
	fmt.Fprintf(inv.stdout, "%s: %d created, %d updated, %d unchanged", verb, counts.Created, counts.Updated, counts.Unchanged)
	if len(counts.Removed) > 0 {
		fmt.Fprintf(inv.stdout, ", %d removed", len(counts.Removed))
	}
	fmt.Fprintln(inv.stdout)
	for _, r := range counts.Removed {
		fmt.Fprintf(inv.stdout, "removed rule %s: domain %s, %s -> limit %s\n", r.ID, r.Domain, describeEntries(r.Descriptor), r.Limit)
	}
	for _, n := range counts.Notes {
		fmt.Fprintf(inv.stdout, "note: %s\n", n)
	}
	return nil
}

// migrated refuses a database with pending migrations, for a command that
// may not apply them: what it would read or count is not the schema the
// service has once they are applied. Reading the version creates goose's
// empty version table in a database never migrated, and nothing else.
func migrated(ctx context.Context, d *db.DB) error {
	current, latest, err := d.MigrationVersion(ctx)
	if err != nil {
		return err
	}
	if current < latest {
		return fmt.Errorf("the database is at migration %d of %d, and a dry run changes nothing, its schema included: "+
			"run \"ratelimitd migrate\" first", current, latest)
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
func exportFile(ctx context.Context, inv *invocation, kind, domain, out string) error {
	if len(inv.args) > 0 {
		return misusef("unexpected argument %q", inv.args[0])
	}
	k, err := limitfile.ParseKind(kind)
	if err != nil {
		return misuse{err}
	}
	if (k == limitfile.Envoy) != (domain != "") {
		return misusef("-domain goes with -kind envoy, and only with it")
	}
	d, err := inv.database(ctx, mustExist, false)
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
		_, err = inv.stdout.Write(data)
		return err
	}
	return os.WriteFile(out, data, 0o644)
}

// tokenCreate creates a token and prints its secret, once.
func tokenCreate(ctx context.Context, inv *invocation, name, scope string, create bool) error {
	if len(inv.args) > 0 {
		return misusef("unexpected argument %q", inv.args[0])
	}
	if msg := auth.NameProblem(name); msg != "" {
		return misusef("-name %s", msg)
	}
	if !auth.Scope(scope).Valid() {
		return misusef("-scope must be admin, support or decide, got %q", scope)
	}
	d, err := inv.database(ctx, creationOf(create), true)
	if err != nil {
		return err
	}
	defer d.Close()
	secret, hash := auth.NewSecret()
	t, err := d.CreateToken(ctx, cliActor, auth.Token{Name: name, Scope: auth.Scope(scope), Hash: hash})
	if err != nil {
		return err
	}
	fmt.Fprintf(inv.stdout, "created token %s (%s, %s); its secret, shown only now:\n%s\n", t.ID, t.Name, t.Scope, secret)
	return nil
}

// tokenList lists the tokens, never a secret.
func tokenList(ctx context.Context, inv *invocation) error {
	if len(inv.args) > 0 {
		return misusef("unexpected argument %q", inv.args[0])
	}
	d, err := inv.database(ctx, mustExist, true)
	if err != nil {
		return err
	}
	defer d.Close()
	tokens, err := d.ListTokens(ctx)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(inv.stdout, 0, 4, 2, ' ', 0)
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

// tokenRevoke revokes the token of the one ID given.
func tokenRevoke(ctx context.Context, inv *invocation) error {
	if len(inv.args) != 1 {
		return misusef("give exactly one ID, got %d arguments", len(inv.args))
	}
	d, err := inv.database(ctx, mustExist, true)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.RevokeToken(ctx, cliActor, inv.args[0]); err != nil {
		return err
	}
	fmt.Fprintf(inv.stdout, "revoked token %s\n", inv.args[0])
	return nil
}
