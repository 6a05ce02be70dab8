package limiter

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxEnum is the largest enum a limit may be interned to; enums fit in 31
// bits so that every database and client holds them as plain integers.
const MaxEnum = 1<<31 - 1

// FirstAssignedEnum is where automatically assigned enums start: 1 to 99
// stay free for explicit numbers and Let's Encrypt's catalogue, so that a
// later import keeps their numbers.
const FirstAssignedEnum = 100

// MaxCost is the largest cost a limit can express: the largest burst,
// which has the shortest emission interval (1 µs) and the longest burst
// offset (100 years). A settle's amounts above it are refused, since no
// bucket could hold them.
const MaxCost = int64(maxBurstOffset / time.Microsecond)

// maxText bounds descriptions and comments, which are free text for people.
const maxText = 1000

// Limit is a named limit: how its bucket ids are written and the default
// parameters of its buckets.
type Limit struct {
	Name string
	// Enum is the small integer the name is interned to in bucket keys. It
	// never changes, so that stored bucket states stay valid.
	Enum int
	// Generation counts the creations of limits with this enum. Enums are
	// never given to another limit, but a catalogue name deleted and
	// created again gets its enum again: the generation, part of its bucket
	// keys, then keeps the new limit from finding the old one's buckets.
	Generation int
	IDFormat   IDFormat
	// Kind is fixed at creation; empty means KindRate.
	Kind Kind
	// Calendar makes the limit a quota of Count units per calendar window
	// in TimeZone, an IANA name, instead of a GCRA rate; empty for rate
	// and concurrency limits, which have no zone.
	Calendar Calendar
	TimeZone string
	Params
	Description string
	// Unit is what a token of the limit counts, for people and metrics;
	// the GCRA does not read it. Empty means DefaultUnit, so that code
	// that builds limits without caring counts requests.
	Unit string
	// Shadow limits are computed, counted and reported, but never deny.
	Shadow    bool
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Validate returns the field errors of l, named as in the REST API. An enum
// of 0 stands for "not chosen yet" and is accepted.
func (l Limit) Validate() []FieldError {
	var ve ValidationError
	if msg := NameProblem(l.Name); msg != "" {
		ve.Add("name", msg)
	}
	if l.Enum < 0 || l.Enum > MaxEnum {
		ve.Add("enum", "must be between 1 and "+strconv.Itoa(MaxEnum))
	}
	if !l.IDFormat.Valid() {
		ve.Add("id_format", "must be one of "+FormatList())
	}
	l.validateKind(&ve)
	if msg := TextProblem(l.Description); msg != "" {
		ve.Add("description", msg)
	}
	if l.Unit != "" && !validUnit(l.Unit) {
		ve.Add("unit", "must match ^[a-z][a-z0-9_-]{0,31}$, such as requests, tokens or bytes")
	}
	return ve.Fields
}

// DefaultUnit is what a limit counts unless it says otherwise.
const DefaultUnit = "requests"

// Counts returns the limit's unit, DefaultUnit when it names none.
func (l Limit) Counts() string {
	if l.Unit == "" {
		return DefaultUnit
	}
	return l.Unit
}

// validUnit checks a unit against ^[a-z][a-z0-9_-]{0,31}$: a short word
// that is safe as a metric label value and in the RateLimit headers.
func validUnit(u string) bool {
	if len(u) == 0 || len(u) > 32 || u[0] < 'a' || u[0] > 'z' {
		return false
	}
	for i := 1; i < len(u); i++ {
		c := u[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Override replaces a limit's defaults for one bucket.
type Override struct {
	// ID is opaque to clients.
	ID    string
	Limit string
	// BucketID is canonical under the limit's IDFormat, or, for the
	// per-account formats, a bare registration id covering the account.
	BucketID string
	// Params are ignored when Unlimited; a Burst of 0 blocks the bucket.
	Params
	// Unlimited exempts the bucket: always allowed, no store call.
	Unlimited bool
	Comment   string
	// Enabled false keeps the override on record without applying it.
	Enabled bool
	// ExpiresAt is when the override stops applying; zero means never.
	ExpiresAt time.Time
	CreatedAt time.Time
	UpdatedAt time.Time
	// UpdatedBy is the name of the token that made the last change.
	UpdatedBy string
	// Version counts the changes of the override; it is its ETag.
	Version int64
}

// NameProblem checks a limit name against ^[A-Za-z][A-Za-z0-9_.-]{0,63}$.
func NameProblem(name string) string {
	if name == "" {
		return "must not be empty"
	}
	if len(name) > 64 {
		return "must be at most 64 characters"
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		switch {
		case i == 0 && !letter:
			return "must start with a letter"
		case !letter && !(c >= '0' && c <= '9') && c != '_' && c != '.' && c != '-':
			return "may hold only letters, digits, '_', '.' and '-'"
		}
	}
	return ""
}

// ValidName reports whether name is a well-formed limit name.
func ValidName(name string) bool { return NameProblem(name) == "" }

// CharProblem says why s cannot be stored as text by every database, ""
// when it can: Postgres refuses NUL and invalid UTF-8 (SQLSTATE 22021)
// where SQLite keeps them, so both are refused before any SQL, and both
// engines answer alike.
func CharProblem(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "must be valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "must not contain NUL"
	}
	return ""
}

// TextProblem says what is wrong with a description or comment, "" when
// nothing is.
func TextProblem(s string) string {
	if msg := CharProblem(s); msg != "" {
		return msg
	}
	switch {
	case len(s) > maxText:
		return "must be at most " + strconv.Itoa(maxText) + " bytes"
	}
	return ""
}

// FormatList names every id format, comma-separated, for messages.
func FormatList() string {
	s := ""
	for i, f := range IDFormats() {
		if i > 0 {
			s += ", "
		}
		s += string(f)
	}
	return s
}

// OverrideFilter selects overrides in a listing; zero fields select all.
type OverrideFilter struct {
	Limit string
	// BucketIDs selects overrides whose canonical bucket id is any of these.
	BucketIDs []string
	Enabled   *bool
	// Query is a case-insensitive substring of the bucket id or comment.
	Query    string
	PageSize int
	// PageToken continues a listing where the previous page ended.
	PageToken string
}

// The actions of history entries.
const (
	ActionCreate = "create"
	ActionUpdate = "update"
	ActionDelete = "delete"
)

// HistoryEntry is one recorded change of an override.
type HistoryEntry struct {
	At     time.Time
	Actor  string
	Action string
	// Before is nil for a creation, After for a deletion.
	Before *Override
	After  *Override
}

// ImportCounts says what an import did, or would do in a dry run.
type ImportCounts struct {
	Created   int
	Updated   int
	Unchanged int
	// Removed holds the rules, as they were, that an import of an Envoy
	// configuration deleted because the file no longer has them.
	Removed []Rule
	// Notes say what an import kept of settings it reads but does not
	// act on as the file's author may expect.
	Notes []string
}
