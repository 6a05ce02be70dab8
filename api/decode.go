package api

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/ratelimitd/ratelimitd/api/input"
	"github.com/ratelimitd/ratelimitd/api/problem"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// The media types of request bodies. YAML goes by three names: only
// application/yaml is registered, but the others are what tools send.
const (
	mediaJSON       = "application/json"
	mediaMergePatch = "application/merge-patch+json"
	mediaYAML       = "application/yaml"
	mediaTextYAML   = "text/yaml"
	mediaXYAML      = "application/x-yaml"
)

// requireMedia refuses, with a 415, a body whose Content-Type is missing or
// none of types. A charset other than UTF-8 is refused too: every body is
// read as UTF-8.
func requireMedia(types ...string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if msg := input.MediaProblem(c.Request().Header.Get(echo.HeaderContentType), types...); msg != "" {
				return problem.Errorf(http.StatusUnsupportedMediaType, "%s", msg)
			}
			return next(c)
		}
	}
}

// readBody reads the request body; the edge bounds it (413).
func readBody(r *http.Request) ([]byte, error) {
	return input.Read(r, nil)
}

// readObject reads and parses the JSON body of c: the one decoding of an
// admin body. Its converter then reads the fields it knows into the
// domain's types, and Err answers every error at once, in body order.
func readObject(c echo.Context) (*input.Body, error) {
	data, err := readBody(c.Request())
	if err != nil {
		return nil, err
	}
	return input.Parse(data)
}

// sortedKeys returns the keys of m in order, for messages that do not
// change from one request to the next.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// query reads the parameters of a query string into a input.Errors's errors:
// an unknown or repeated parameter is an error, and so is a value that
// does not parse. A parameter given empty counts as not given, as HTML
// forms send every field.
type query struct {
	values map[string][]string
	errs   *input.Errors
}

// readQuery checks that the query string of c holds only the parameters
// known.
func readQuery(c echo.Context, errs *input.Errors, known ...string) query {
	q := query{values: c.QueryParams(), errs: errs}
	for _, name := range sortedKeys(q.values) {
		switch {
		case !slices.Contains(known, name):
			errs.Add(name, "unknown parameter; known are "+strings.Join(known, ", "))
		case len(q.values[name]) > 1:
			errs.Add(name, "must be given at most once")
		default:
			if msg := limiter.CharProblem(q.values[name][0]); msg != "" {
				errs.Add(name, msg)
			}
		}
	}
	return q
}

// pathParams decodes the route's path parameters exactly once and refuses,
// with a 422 naming the parameter, what no database could look up. The
// router matches on the request's escaped path whenever it differs from
// the default encoding ("/v1/limits/%41bc"), and then hands the
// parameters over still escaped; otherwise they arrive decoded.
func pathParams(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		escaped := c.Request().URL.RawPath != ""
		var errs input.Errors
		values := c.ParamValues()
		for i, name := range c.ParamNames() {
			v := values[i]
			if escaped {
				var err error
				if v, err = url.PathUnescape(v); err != nil {
					errs.Add(name, "is not percent-encoded correctly")
					continue
				}
			}
			if msg := limiter.CharProblem(v); msg != "" {
				errs.Add(name, msg)
			}
			values[i] = v
		}
		if err := errs.Err(); err != nil {
			return err
		}
		c.SetParamValues(values...)
		return next(c)
	}
}

// str returns the parameter called name, "" when absent.
func (q query) str(name string) string {
	if v := q.values[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// boolean returns the parameter called name, nil when absent.
func (q query) boolean(name string) *bool {
	var b bool
	switch q.str(name) {
	case "":
		return nil
	case "true":
		b = true
	case "false":
	default:
		q.errs.Add(name, "must be true or false")
		return nil
	}
	return &b
}

// integer returns the parameter called name, def when absent.
func (q query) integer(name string, lo, hi, def int) int {
	v := q.str(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		q.errs.Add(name, "must be an integer from "+strconv.Itoa(lo)+" to "+strconv.Itoa(hi))
		return def
	}
	return n
}

// required returns the parameter called name, and records that it is
// missing when it is.
func (q query) required(name string) string {
	v := q.str(name)
	if v == "" {
		q.errs.Add(name, "is required")
	}
	return v
}
