package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/limitfile"
)

// A command is one of ratelimitd's commands, or one action of a command
// that has several ("token create"). run dispatches on the table below and
// help prints it, so that what the program does and what it says it does
// cannot drift apart.
type command struct {
	// name is what the user types: "import", "token create".
	name string
	// synopsis follows "ratelimitd " in the usage line: the name, the
	// command's own flags and its positional arguments.
	synopsis string
	// summary is the command's line in the list of commands.
	summary string
	// about is what help says after the usage line.
	about string
	// noSettings is true for a command that reads no RATELIMIT_* setting.
	noSettings bool
	// shown are the flags of the settings that help lists after the
	// command's own; nil lists every setting.
	shown []string
	// define registers the command's own flags and returns what runs the
	// command once they are parsed.
	define func(fs *flag.FlagSet) runner
}

// runner runs a parsed command.
type runner func(ctx context.Context, inv *invocation) error

// invocation is one run of a command: the program's surroundings, and
// what its command line said.
type invocation struct {
	now    func() time.Time
	getenv func(string) string
	// stdout is for what the user reads, stderr for the JSON log and for
	// notes beside a result that scripts read on stdout.
	stdout, stderr io.Writer
	// cfg is nil for a command that reads no settings.
	cfg *config
	// args are the positional arguments, in order.
	args []string
}

// misuse is an error of the command line: a flag that does not parse, an
// argument too many or missing. exec adds the command's usage line to it.
type misuse struct{ error }

func (m misuse) Unwrap() error { return m.error }

// misusef is a misuse with a message.
func misusef(format string, args ...any) error {
	return misuse{fmt.Errorf(format, args...)}
}

// Settings that the administration commands read, which their help lists;
// the others are taken too, and serve -h lists them.
var (
	databaseSettings        = []string{"database-url", "log-level"}
	databaseMigrateSettings = []string{"database-url", "migrate", "log-level"}
)

// commands lists every command and action, in the order help shows them.
var commands = []*command{
	{
		name: "serve", synopsis: "serve",
		summary: "run the service: the API and admin page on 127.0.0.1:8080, Envoy's rate limit service (gRPC) on 127.0.0.1:8081",
		about: `Runs the service until SIGTERM or SIGINT, then finishes the requests in flight.
It binds every listener before it writes anything, so that a start that fails
on a busy port changes nothing; then it opens the database (creating a SQLite
file that does not exist) and applies pending migrations. With no token in the
database and no bootstrap token, it creates an admin token and prints its
secret once; a later start names the admin token that exists.`,
		define: func(*flag.FlagSet) runner { return serveOn },
	},
	{
		name: "migrate", synopsis: "migrate [up|status]",
		summary: "apply pending database migrations (up, the default), or show the database's version (status)",
		about: `up applies the pending migrations, creating a SQLite file that does not exist;
status shows the version and changes nothing. Both print the version:
"sqlite database at migration 10 of 10". With RATELIMIT_MIGRATE=false on the
replicas, run "ratelimitd migrate" once before a rollout.`,
		shown:  databaseSettings,
		define: func(*flag.FlagSet) runner { return migrate },
	},
	{
		name: "import", synopsis: "import [-kind defaults|overrides|envoy] [-merge] [-dry-run] [-create] FILE",
		summary: "import limits, overrides or Envoy rules from a YAML file, all or nothing",
		about: `Reads FILE in one of Boulder's formats (defaults: a map of limits; overrides:
a list) or as envoyproxy/ratelimit's configuration (envoy), and writes all of it,
or nothing when an entry is bad: each bad entry is listed as FILE:LINE. An Envoy
configuration replaces its domain's rules, or with -merge is added to them.`,
		shown: databaseMigrateSettings,
		define: func(fs *flag.FlagSet) runner {
			kind := fs.String("kind", "", "what FILE holds: `defaults|overrides|envoy`; defaults or overrides is told from the document when left out")
			merge := fs.Bool("merge", false, "with -kind envoy: add FILE's descriptors to its domain's rules, keeping the others; a descriptor the domain has is a bad entry")
			dryRun := fs.Bool("dry-run", false, "validate and count, write nothing")
			create := createFlag(fs)
			return func(ctx context.Context, inv *invocation) error {
				return importFile(ctx, inv, *kind, limitfile.ImportOptions{DryRun: *dryRun, Merge: *merge}, *create)
			}
		},
	},
	{
		name: "export", synopsis: "export -kind defaults|overrides|envoy [-domain DOMAIN] [-o FILE]",
		summary: "export limits, overrides or a domain's Envoy rules in the formats import reads",
		about:   `Writes to standard output, or to FILE with -o.`,
		shown:   databaseSettings,
		define: func(fs *flag.FlagSet) runner {
			kind := fs.String("kind", "", "what to write: `defaults|overrides|envoy`")
			domain := fs.String("domain", "", "the `DOMAIN` whose rules -kind envoy writes; only with it")
			out := fs.String("o", "", "write to `FILE` instead of standard output")
			return func(ctx context.Context, inv *invocation) error { return exportFile(ctx, inv, *kind, *domain, *out) }
		},
	},
	{
		name: "token create", synopsis: "token create -name NAME -scope admin|support|decide [-create]",
		summary: "create an API token and print its secret, shown only then",
		about: `Creates a token in the database; it works on every replica within a second.
The command needs no token: whoever can reach the database may run it. This is
how to get a new admin token when the one printed on the first start is lost.`,
		shown: databaseMigrateSettings,
		define: func(fs *flag.FlagSet) runner {
			name := fs.String("name", "", "the token's `NAME`, recorded as the actor of its changes")
			scope := fs.String("scope", "", "`admin|support|decide`: everything; overrides, resets and checks; or decisions only")
			create := createFlag(fs)
			return func(ctx context.Context, inv *invocation) error { return tokenCreate(ctx, inv, *name, *scope, *create) }
		},
	},
	{
		name: "token list", synopsis: "token list",
		summary: "list the tokens: id, name, scope, created, revoked; never a secret",
		about:   `Lists every token, revoked ones included, oldest first.`,
		shown:   databaseMigrateSettings,
		define:  func(*flag.FlagSet) runner { return tokenList },
	},
	{
		name: "token revoke", synopsis: "token revoke ID",
		summary: "revoke a token",
		about:   `Revokes the token ID ("ratelimitd token list" shows the ids): it stops working on every replica within a second.`,
		shown:   databaseMigrateSettings,
		define:  func(*flag.FlagSet) runner { return tokenRevoke },
	},
	{
		name: "version", synopsis: "version",
		summary:    "print the version",
		about:      `Prints "ratelimitd VERSION".`,
		noSettings: true,
		define: func(*flag.FlagSet) runner {
			return func(_ context.Context, inv *invocation) error {
				if len(inv.args) > 0 {
					return misusef("unexpected argument %q", inv.args[0])
				}
				fmt.Fprintln(inv.stdout, "ratelimitd", version)
				return nil
			}
		},
	},
}

// groups says what each command made of actions is for.
var groups = map[string]string{
	"token": `Manages the API's tokens in the database, without a token of its own: whoever
can reach the database may run it.`,
}

// commandNamed returns the command or action of that name, or nil.
func commandNamed(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// actionsOf returns the actions of a command made of actions ("token").
func actionsOf(group string) []*command {
	var out []*command
	for _, c := range commands {
		if strings.HasPrefix(c.name, group+" ") {
			out = append(out, c)
		}
	}
	return out
}

// isHelp reports whether an argument asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help"
}

// dispatch finds the command that args name and runs it with the rest.
func dispatch(ctx context.Context, inv invocation, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("no command\n\n%s", overview())
	}
	if args[0] == "help" || isHelp(args[0]) {
		return help(inv.stdout, args[1:])
	}
	if len(args) > 1 {
		if c := commandNamed(args[0] + " " + args[1]); c != nil {
			return c.exec(ctx, inv, args[2:])
		}
	}
	if c := commandNamed(args[0]); c != nil {
		return c.exec(ctx, inv, args[1:])
	}
	if _, ok := groups[args[0]]; ok {
		switch {
		case len(args) == 1:
			return fmt.Errorf("%s: name an action first\n%s", args[0], groupUsage(args[0]))
		case isHelp(args[1]):
			return groupHelp(inv.stdout, args[0])
		}
		return fmt.Errorf("%s: unknown action %q; the action comes first\n%s", args[0], args[1], groupUsage(args[0]))
	}
	if strings.HasPrefix(args[0], "-") {
		return fmt.Errorf("flags go after the command: ratelimitd COMMAND [flags] [arguments]; \"ratelimitd help\" lists the commands")
	}
	return fmt.Errorf("unknown command %q; \"ratelimitd help\" lists the commands", args[0])
}

// exec parses args, the command's own flags and the settings, in any order
// with its positional arguments, and runs the command. -h, -help and
// --help print its help on stdout instead. A misuse of the command line
// comes back with the usage line.
func (c *command) exec(ctx context.Context, inv invocation, args []string) error {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	// Errors come back as values, with the usage line, not printed here.
	fs.SetOutput(io.Discard)
	runCmd := c.define(fs)
	var err error
	if c.noSettings {
		inv.args, err = parseArgs(fs, args)
	} else {
		inv.cfg, inv.args, err = loadConfig(fs, args, inv.getenv)
	}
	if err == nil {
		err = runCmd(ctx, &inv)
	}
	var m misuse
	switch {
	case errors.Is(err, flag.ErrHelp):
		return c.help(inv.stdout)
	case errors.As(err, &m):
		return fmt.Errorf("%s: %w\nusage: ratelimitd %s\n\"ratelimitd %s -h\" shows its flags", c.name, m.error, c.synopsis, c.name)
	}
	return err
}

// parseArgs parses the flags in args wherever they stand among the
// positional arguments, which it returns in order: parse, take one
// positional argument, parse the rest. After "--" every argument is
// positional. -h is flag.ErrHelp; any other error is a misuse.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		if err != nil {
			return nil, misuse{err}
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(positional, rest...), nil
		}
		if len(rest) == 0 {
			return positional, nil
		}
		positional, args = append(positional, rest[0]), rest[1:]
	}
}

// help prints the list of commands, or the help of the command or the
// group of actions that args name.
func help(w io.Writer, args []string) error {
	name := strings.Join(args, " ")
	if name == "" || isHelp(name) {
		_, err := io.WriteString(w, overview())
		return err
	}
	if c := commandNamed(name); c != nil {
		return c.help(w)
	}
	if _, ok := groups[name]; ok {
		return groupHelp(w, name)
	}
	return fmt.Errorf("help: unknown command %q; \"ratelimitd help\" lists the commands", name)
}

// overview is the list of commands.
func overview() string {
	var b strings.Builder
	b.WriteString("usage: ratelimitd COMMAND [flags] [arguments]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %s\n        %s\n", c.synopsis, c.summary)
	}
	b.WriteString(`  help [COMMAND]
        show the help of a command, as "ratelimitd COMMAND -h" does

Flags may stand before or after the arguments. Every command but version and
help also reads the RATELIMIT_* settings, each of which a flag overrides;
"ratelimitd serve -h" lists them.
`)
	return b.String()
}

// help prints the command's usage line, what it does, its own flags, and
// the settings it reads: all of them for serve, the few that matter with
// a reference to the rest for the others, so that the command's own are
// not buried.
func (c *command) help(w io.Writer) error {
	fmt.Fprintf(w, "usage: ratelimitd %s\n\n%s\n", c.synopsis, c.about)
	own := flag.NewFlagSet(c.name, flag.ContinueOnError)
	own.SetOutput(w)
	c.define(own)
	if hasFlags(own) {
		fmt.Fprint(w, "\nFlags:\n")
		own.PrintDefaults()
	}
	if c.noSettings {
		return nil
	}
	shared := flag.NewFlagSet("settings", flag.ContinueOnError)
	shared.SetOutput(w)
	for _, s := range settings {
		if c.shown == nil || slices.Contains(c.shown, s.flag) {
			shared.String(s.flag, "", s.help())
		}
	}
	if c.shown == nil {
		fmt.Fprint(w, "\nSettings, each a RATELIMIT_* variable or its flag (the flag wins):\n")
	} else {
		fmt.Fprint(w, "\nSettings it uses, each a RATELIMIT_* variable or its flag (the flag wins);\n\"ratelimitd serve -h\" lists the others, which every command takes too:\n")
	}
	shared.PrintDefaults()
	return nil
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// groupUsage is the usage lines of a command's actions.
func groupUsage(group string) string {
	var b strings.Builder
	for i, c := range actionsOf(group) {
		lead := "usage: "
		if i > 0 {
			lead = "       "
		}
		fmt.Fprintf(&b, "%sratelimitd %s\n", lead, c.synopsis)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// groupHelp prints the usage lines of a command's actions and what the
// command is for.
func groupHelp(w io.Writer, group string) error {
	_, err := fmt.Fprintf(w, "%s\n\n%s\n\n\"ratelimitd %s ACTION -h\" shows an action's flags and settings.\n", groupUsage(group), groups[group], group)
	return err
}
