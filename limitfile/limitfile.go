// Package limitfile reads and writes limits and overrides as YAML files in
// the formats of Let's Encrypt's Boulder, so that a Boulder deployment's
// configuration can be imported as it is and ours exported in a form people
// already know.
//
// Two kinds of document exist. Defaults is a map from limit name to its
// parameters:
//
//	NewOrdersPerAccount:
//	  burst: 300
//	  count: 300
//	  period: 3h
//
// Overrides is either Boulder's list format, one single-key map per entry
// whose ids share the entry's parameters,
//
//	# the list format
//	- NewOrdersPerAccount:
//	    burst: 3000
//	    count: 3000
//	    period: 3h
//	    ids:
//	      - "12345"
//	      - id: "67890"
//	        comment: a big customer
//
// or Boulder's older map format, keyed by the limit name and the bucket id
// joined by the first colon:
//
//	NewOrdersPerAccount:12345: {burst: 3000, count: 3000, period: 3h}
//
// An import is all or nothing: every entry is checked first, against the
// limits already stored, and any bad entry means nothing is written and
// every problem is reported with its line.
package limitfile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Kind says which document a file holds; a file never mixes them, because
// Boulder keeps defaults and overrides in separate files too.
type Kind string

// The kinds of document.
const (
	// Defaults documents hold limits: names, id formats and default parameters.
	Defaults Kind = "defaults"
	// Overrides documents hold per-bucket parameters of existing limits.
	Overrides Kind = "overrides"
)

// ParseKind turns the kind named by a query parameter or a command-line
// flag into a Kind, with an error message fit for the person who typed it.
func ParseKind(s string) (Kind, error) {
	switch k := Kind(s); k {
	case Defaults, Overrides, Envoy:
		return k, nil
	case "":
		return "", errors.New(`kind is missing: want "defaults", "overrides" or "envoy"`)
	}
	return "", fmt.Errorf(`kind %q is unknown: want "defaults", "overrides" or "envoy"`, clip(s))
}

// DetectKind tells the kind of a document from its shape, for a command
// line that names only the file: overrides are a list, or a map whose keys
// are "<limit>:<id>"; defaults are a map of limit names, which never hold a
// colon. The error of a document that does not parse is its EntryError,
// with its line.
func DetectKind(data []byte) (Kind, error) {
	root, bad := decode(data)
	switch {
	case bad == errEmpty:
		return "", errors.New("the document is empty: nothing tells its kind")
	case bad != nil:
		return "", bad
	case root.Kind == yaml.SequenceNode:
		return Overrides, nil
	case root.Kind == yaml.MappingNode && len(root.Content) > 0 && strings.Contains(root.Content[0].Value, ":"):
		return Overrides, nil
	case root.Kind == yaml.MappingNode:
		return Defaults, nil
	}
	return "", fmt.Errorf("line %d: the document is %s, neither a map of limits nor a list of overrides; name its kind",
		root.Line, describe(root))
}

// Store is what import and export need of the database; *db.DB satisfies it.
// It is an interface so that the REST API and the command line share one
// implementation of the whole flow, and tests can run it without a database.
type Store interface {
	// ListLimits returns every limit.
	ListLimits(ctx context.Context) ([]limiter.Limit, error)
	// OverrideCounts returns the number of overrides of each limit that has any.
	OverrideCounts(ctx context.Context) (map[string]int, error)
	// Import writes limits and overrides in one transaction, or with dryRun
	// only counts what it would write.
	Import(ctx context.Context, actor string, limits []limiter.Limit, overrides []limiter.Override, dryRun bool) (limiter.ImportCounts, error)
	// Full streams every limit, then every enabled override.
	Full(ctx context.Context, onLimit func(limiter.Limit) error, onOverride func(limiter.Override) error) (int64, error)
}

// EntryError is a bad entry of a document. Import returns these apart from
// its error, because they are the uploader's to fix (the REST API answers
// them with 422) while the error is the server's.
type EntryError struct {
	// Line is the 1-based line of the problem: the entry's first line, or,
	// when one field or id of the entry is at fault, that field's or id's
	// line, so that an error in a list of thousands of ids can be found. It
	// is 0 when the document does not parse into entries.
	Line int `json:"line"`
	// Entry is the entry's key, e.g. "NewOrdersPerAccount" or
	// "NewOrdersPerAccount:12345" (in the list format, the limit name and,
	// for a problem with one id, that id as written). It is "" for a problem
	// of the whole document.
	Entry string `json:"entry"`
	// Message says what is wrong, naming the field, e.g.
	// "burst: must be at least 1" or "ids[2]: must be a positive decimal integer".
	Message string `json:"message"`
}

// Error formats e as "line 3: NewOrdersPerAccount: burst: must be at least 1",
// the form the command line prints.
func (e EntryError) Error() string {
	s := ""
	if e.Line > 0 {
		s = "line " + strconv.Itoa(e.Line) + ": "
	}
	if e.Entry != "" {
		s += e.Entry + ": "
	}
	return s + e.Message
}

// boulderProblem says why Boulder's formats cannot describe l or its
// overrides, "" when they can: they know rate limits only, and a
// concurrency limit or a calendar quota read back as one would be another
// limit. Boulder's own loader refuses keys it does not know, so none is
// added for them; an export leaves them out and says so in a comment, and
// an import never turns a limit into another kind.
func boulderProblem(l limiter.Limit) string {
	switch {
	case l.Quota():
		return "limit " + l.Name + " is a calendar quota (" + string(l.Calendar) + "), which Boulder's format cannot describe"
	case l.KindOf() == limiter.KindConcurrency:
		return "limit " + l.Name + " is a concurrency limit, which Boulder's format cannot describe"
	}
	return ""
}

// ImportOptions say how an import writes.
type ImportOptions struct {
	// DryRun checks and counts, and writes nothing.
	DryRun bool
	// Merge adds an Envoy configuration's descriptors to its domain's
	// rules and keeps the others, as envoyproxy/ratelimit adds up the
	// files of one domain under MERGE_DOMAIN_CONFIG: a top-level
	// descriptor that the domain has already is an entry error, as two
	// files holding it are there. Without it the file replaces the
	// domain's rules. Only for Envoy configurations.
	Merge bool
}

// Import parses data as a document of the given kind, checks every entry
// against Let's Encrypt's catalogue and the limits in st, and writes all of
// them in one call of st.Import, or nothing. When any entry is bad it
// returns every EntryError, sorted by line, and writes nothing; the error is
// for failures of st (or a bad kind), never for the document.
//
// A defaults entry describes a whole limit, but what it leaves out of an
// existing limit stays as it is: its id format, enum, description and shadow
// flag, so that a Boulder file, which knows none of them, can be imported
// over limits configured here. Overrides name existing limits only; an
// override that exists keeps its enabled flag and expiry (see
// db.DB.Import). An entry, of either kind of document, that names a
// concurrency limit or a calendar quota is bad (see boulderProblem). A key
// without a value is as if it were not there, and an empty document writes
// nothing. YAML aliases are refused: they would let a small document stand
// for millions of overrides, and no export has them.
//
// The checks read st before the write, so a limit changed in between can
// still make st.Import fail with a conflict; it then writes nothing either.
func Import(ctx context.Context, st Store, actor string, kind Kind, data []byte, opts ImportOptions) (limiter.ImportCounts, []EntryError, error) {
	if _, err := ParseKind(string(kind)); err != nil {
		return limiter.ImportCounts{}, nil, err
	}
	if kind == Envoy {
		es, ok := st.(EnvoyStore)
		if !ok {
			return limiter.ImportCounts{}, nil, errors.New("this store cannot hold rules, which an Envoy configuration needs")
		}
		return ImportEnvoy(ctx, es, actor, data, opts)
	}
	if opts.Merge {
		return limiter.ImportCounts{}, nil, errors.New("merge is only for an Envoy configuration: Boulder's files add to the limits and overrides already")
	}
	root, bad := decode(data)
	switch {
	case bad == errEmpty:
		return limiter.ImportCounts{}, nil, nil
	case bad != nil:
		return limiter.ImportCounts{}, []EntryError{*bad}, nil
	}
	stored, err := st.ListLimits(ctx)
	if err != nil {
		return limiter.ImportCounts{}, nil, err
	}
	var (
		limits    []limiter.Limit
		overrides []limiter.Override
		errs      []EntryError
	)
	if kind == Defaults {
		counts, err := st.OverrideCounts(ctx)
		if err != nil {
			return limiter.ImportCounts{}, nil, err
		}
		limits, errs = readDefaults(root, stored, counts)
	} else {
		overrides, errs = readOverrides(root, stored)
	}
	if len(errs) > 0 {
		slices.SortStableFunc(errs, func(a, b EntryError) int { return a.Line - b.Line })
		return limiter.ImportCounts{}, errs, nil
	}
	if len(limits) == 0 && len(overrides) == 0 {
		return limiter.ImportCounts{}, nil, nil
	}
	counts, err := st.Import(ctx, actor, limits, overrides, opts.DryRun)
	if err != nil {
		return limiter.ImportCounts{}, nil, err
	}
	return counts, nil, nil
}

// Export writes the limits (Defaults) or the enabled overrides (Overrides)
// of st in the format Import reads, so that importing an export changes
// nothing: every entry is counted unchanged. The output is deterministic:
// limits sorted by name, overrides grouped by limit and parameters, ids
// sorted.
//
// Boulder's formats cannot say that an override is disabled or when it
// expires, so disabled overrides are left out and enabled ones are written
// without their expiry: imported into another database they would apply
// for ever. An override that has expired but is still enabled is written
// like any other, since Export reads no clock. Concurrency limits and
// calendar quotas, and their overrides, are left out too, each named in a
// comment at the top (see boulderProblem).
func Export(ctx context.Context, st Store, kind Kind) ([]byte, error) {
	switch kind {
	case Defaults:
		return exportDefaults(ctx, st)
	case Overrides:
		return exportOverrides(ctx, st)
	case Envoy:
		return nil, errors.New("an Envoy configuration is exported one domain at a time, by ExportEnvoy")
	}
	_, err := ParseKind(string(kind))
	return nil, err
}
