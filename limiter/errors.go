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
)

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
