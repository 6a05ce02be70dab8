package api

import (
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limitfile"
)

// Files is what imports and exports read and write through: package
// limitfile's stores, of Boulder's formats and of Envoy's.
type Files interface {
	limitfile.Store
	limitfile.EnvoyStore
}

// importResult is the answer of an import that wrote, or in a dry run
// would write, everything.
type importResult struct {
	Created   int                    `json:"created"`
	Updated   int                    `json:"updated"`
	Unchanged int                    `json:"unchanged"`
	Removed   []ruleResponse         `json:"removed,omitempty"`
	Notes     []string               `json:"notes,omitempty"`
	Errors    []limitfile.EntryError `json:"errors"`
}

// toImportResult converts the counts of an import.
func toImportResult(c limiter.ImportCounts) importResult {
	out := importResult{Created: c.Created, Updated: c.Updated, Unchanged: c.Unchanged,
		Notes: c.Notes, Errors: []limitfile.EntryError{}}
	for _, r := range c.Removed {
		out.Removed = append(out.Removed, toRuleResponse(r))
	}
	return out
}

// importFailure is an import refused for bad entries; nothing was written.
// Its problem lists the entries with their lines instead of fields.
type importFailure struct {
	entries []limitfile.EntryError
}

func (e *importFailure) Error() string {
	return strconv.Itoa(len(e.entries)) + " invalid entries, the first: " + e.entries[0].Error()
}

// importProblem is the body of a refused import: a problem with the
// counts of an import, all zero, and the bad entries as its errors, which
// take the place of the problem's field errors.
type importProblem struct {
	*problem.Problem
	Created   int                    `json:"created"`
	Updated   int                    `json:"updated"`
	Unchanged int                    `json:"unchanged"`
	Errors    []limitfile.EntryError `json:"errors"`
}

// Word implements problem.Worder.
func (e *importFailure) Word(p *problem.Problem) any {
	p.Status, p.Detail = http.StatusUnprocessableEntity, strconv.Itoa(len(e.entries))+" entries are invalid; nothing was written"
	if len(e.entries) == 1 {
		p.Detail = "1 entry is invalid; nothing was written"
	}
	return &importProblem{Problem: p, Errors: e.entries}
}

// importFile reads limits or overrides in Boulder's YAML formats, or an
// envoyproxy/ratelimit configuration, all or nothing; merge adds the
// latter to its domain's rules instead of replacing them.
func (s *Server) importFile(c echo.Context) error {
	var errs input.Errors
	q := readQuery(c, &errs, "kind", "dry_run", "merge")
	kind := kindParam(q)
	dryRun, merge := q.boolean("dry_run"), q.boolean("merge")
	if merge != nil && *merge && kind != limitfile.Envoy && kind != "" {
		errs.Add("merge", "is only for kind=envoy")
	}
	if err := errs.Err(); err != nil {
		return err
	}
	data, err := readBody(c.Request())
	if err != nil {
		return err
	}
	opts := limitfile.ImportOptions{DryRun: dryRun != nil && *dryRun, Merge: merge != nil && *merge}
	counts, entries, err := limitfile.Import(c.Request().Context(), s.cfg.Files, principal(c).Name, kind, data, opts)
	if err != nil {
		return err
	}
	if len(entries) > 0 {
		return &importFailure{entries: entries}
	}
	s.awaitSnapshot(c)
	return writeJSON(c, http.StatusOK, toImportResult(counts))
}

// exportFile writes limits or overrides in the formats importFile reads,
// or the rules of one domain as an Envoy configuration.
func (s *Server) exportFile(c echo.Context) error {
	var errs input.Errors
	q := readQuery(c, &errs, "kind", "domain")
	kind := kindParam(q)
	domain := q.str("domain")
	switch {
	case kind == limitfile.Envoy && domain == "":
		errs.Add("domain", "is required with kind=envoy")
	case kind != limitfile.Envoy && domain != "":
		errs.Add("domain", "is only for kind=envoy")
	}
	if err := errs.Err(); err != nil {
		return err
	}
	var data []byte
	var err error
	if kind == limitfile.Envoy {
		data, err = limitfile.ExportEnvoy(c.Request().Context(), s.cfg.Files, domain)
	} else {
		data, err = limitfile.Export(c.Request().Context(), s.cfg.Files, kind)
	}
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, mediaYAML, data)
}

// kindParam reads the required kind parameter.
func kindParam(q query) limitfile.Kind {
	v := q.required("kind")
	if v == "" {
		return ""
	}
	kind, err := limitfile.ParseKind(v)
	if err != nil {
		q.errs.Add("kind", `must be "defaults", "overrides" or "envoy"`)
	}
	return kind
}
