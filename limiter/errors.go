package limiter

import (
	"errors"
	"strings"
)

// Sentinel errors shared by every layer; adapters translate their own
// failures into these so that callers can map them without knowing the
// backend.
var (
	// ErrNotFound reports that a limit, override, token or bucket does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict reports a uniqueness or reference conflict.
	ErrConflict = errors.New("conflict")
	// ErrPrecondition reports that a version precondition (If-Match) failed.
	ErrPrecondition = errors.New("precondition failed")
	// ErrUnavailable reports that a backend the operation needs cannot be reached.
	ErrUnavailable = errors.New("backend unavailable")
	// ErrInvalid reports a value that only the stored state shows to be
	// invalid, such as an enum that was given before.
	ErrInvalid = errors.New("invalid")
)

// The particular absences, conflicts and invalid values that the database
// reports. Each wraps its kind above, so that a caller that only needs the
// kind tests for that; the caller that answers a client words each, with
// the names it asked about.
var (
	ErrLimitNotFound    = &sentinel{"limit not found", ErrNotFound}
	ErrOverrideNotFound = &sentinel{"override not found", ErrNotFound}
	ErrRuleNotFound     = &sentinel{"rule not found", ErrNotFound}
	// ErrTokenNotFound is also a token already revoked: a revoked token
	// cannot be revoked again.
	ErrTokenNotFound = &sentinel{"token not found or revoked", ErrNotFound}

	ErrLimitExists = &sentinel{"the limit exists", ErrConflict}
	// ErrOverrideExists is an override of the same limit and bucket.
	ErrOverrideExists = &sentinel{"an override of the bucket exists", ErrConflict}
	// ErrRuleExists is a rule of the same domain and descriptor pattern.
	ErrRuleExists = &sentinel{"a rule of the pattern exists", ErrConflict}
	// ErrTokenExists is a live token of the same name, or the same secret.
	ErrTokenExists = &sentinel{"the token exists", ErrConflict}
	// ErrEnumTaken is an enum another limit holds.
	ErrEnumTaken = &sentinel{"the enum is taken", ErrConflict}
	// ErrEnumFixed is a change of a limit's enum, which never changes.
	ErrEnumFixed = &sentinel{"an enum cannot change", ErrConflict}
	// ErrIDFormatFixed is a change of the id format of a limit that has
	// overrides, whose bucket ids are written in it.
	ErrIDFormatFixed = &sentinel{"the id format cannot change while overrides exist", ErrConflict}
	// ErrKindFixed is a change of a limit's kind, or of a rate limit into
	// a calendar quota or back: its stored bucket states would mean
	// something else.
	ErrKindFixed = &sentinel{"a limit's kind cannot change", ErrConflict}
	// ErrIDRefused is an override whose limit's id format changed, between
	// reading and writing, to one that refuses its bucket id.
	ErrIDRefused = &sentinel{"the limit's id format refuses the bucket id", ErrConflict}
	// ErrParamsRefused is an imported override whose limit changed,
	// between reading and writing, to one its parameters do not fit.
	ErrParamsRefused = &sentinel{"the limit refuses the override's parameters", ErrConflict}
	// ErrHasOverrides and ErrHasRules are a limit that cannot be deleted
	// while they refer to it.
	ErrHasOverrides = &sentinel{"the limit has overrides", ErrConflict}
	ErrHasRules     = &sentinel{"rules use the limit", ErrConflict}

	// ErrUnknownLimit is a limit named by an override or a rule that does
	// not exist: the value of a field, not the resource asked for.
	ErrUnknownLimit = &sentinel{"unknown limit", ErrInvalid}
	// ErrEnumRetired is an enum a deleted limit held: an enum is never
	// given twice, so that no limit finds the buckets of another.
	ErrEnumRetired = &sentinel{"the enum was a deleted limit's", ErrInvalid}
	// ErrNoEnumLeft is a limit created when every enum was given.
	ErrNoEnumLeft = &sentinel{"no enum is left", ErrInvalid}
	// ErrPageToken is a page token that no listing gave.
	ErrPageToken = &sentinel{"not a page token", ErrInvalid}

	// ErrNotDurable is a write the store made but cannot vouch for: a
	// failover of the store may forget it (a Redis primary whose replicas
	// did not acknowledge it in time). The store is up; the fail mode
	// answers the decision as for any store error.
	ErrNotDurable = &sentinel{"written, but not known to survive a failover", ErrUnavailable}
)

// sentinel is a particular error of a kind.
type sentinel struct {
	msg  string
	kind error
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.kind }

// FieldError names one invalid field and why it is invalid. Field uses the
// request's JSON path, for example "buckets[1].bucket_id".
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error returns "field: message".
func (e FieldError) Error() string { return e.Field + ": " + e.Message }

// ValidationError lists every invalid field of one input at once.
type ValidationError struct {
	Fields []FieldError
}

// Error joins the field errors into one line.
func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Field + ": " + f.Message
	}
	return "invalid input: " + strings.Join(parts, "; ")
}

// Add records that field is invalid for the reason message.
func (e *ValidationError) Add(field, message string) {
	e.Fields = append(e.Fields, FieldError{Field: field, Message: message})
}

// Err returns e when it holds at least one field error, else nil, so that a
// converter can collect errors and return them in one statement.
func (e *ValidationError) Err() error {
	if len(e.Fields) == 0 {
		return nil
	}
	return e
}
