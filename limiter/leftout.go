package limiter

import (
	"cmp"
	"errors"
	"maps"
	"slices"
	"strings"
)

// LeftOut is a stored row that a snapshot does not hold, because this
// version cannot use it: a time zone it lacks, an id format, kind or rule
// member a newer version wrote, parameters no decision can use, an enum
// another limit holds; or the row depends on a limit left out. Everything
// else is loaded, so that no row can stall loading.
type LeftOut struct {
	// Entity is "limit", "override" or "rule".
	Entity string
	// ID is the limit's name, or the override's or the rule's id.
	ID string
	// Limit is the limit of an override or a rule.
	Limit string
	// Reason says why, for an operator.
	Reason string
}

// The entities of LeftOut.
const (
	EntityLimit    = "limit"
	EntityOverride = "override"
	EntityRule     = "rule"
)

// LeftOut returns the rows the snapshot lacks, sorted by entity and id.
func (s *Snapshot) LeftOut() []LeftOut {
	out := slices.Collect(maps.Values(s.leftOut))
	slices.SortFunc(out, func(a, b LeftOut) int {
		return cmp.Or(strings.Compare(a.Entity, b.Entity), strings.Compare(a.ID, b.ID))
	})
	return out
}

// leftKey is the key of a row in Snapshot.leftOut.
func leftKey(entity, id string) string { return entity + "\x00" + id }

// leave records a row that the snapshot leaves out, or, when err is nil,
// that it holds the row. A dependent row (an override or a rule) that
// failed because its limit is not in the snapshot is recorded only when
// that limit is left out itself: otherwise the limit is simply not there
// yet (a full load reads rules after the limits), and the row has no
// error of its own.
func (b *Builder) leave(entity, id, limit string, err error) {
	key := leftKey(entity, id)
	if err == nil {
		if _, ok := b.snap.leftOut[key]; ok {
			b.ownLeftOut()
			delete(b.snap.leftOut, key)
		}
		return
	}
	reason := reasonOf(err)
	if errors.Is(err, ErrNotFound) && entity != EntityLimit {
		if _, ok := b.snap.leftOut[leftKey(EntityLimit, limit)]; !ok {
			return
		}
		reason = "its limit " + limit + " is left out"
	}
	b.ownLeftOut()
	b.snap.leftOut[key] = LeftOut{Entity: entity, ID: id, Limit: limit, Reason: reason}
}

// reasonOf words the error of a row left out: its field errors, or the
// error.
func reasonOf(err error) string {
	var ve *ValidationError
	if errors.As(err, &ve) && len(ve.Fields) > 0 {
		parts := make([]string, len(ve.Fields))
		for i, f := range ve.Fields {
			parts[i] = f.Field + ": " + f.Message
		}
		return strings.Join(parts, "; ")
	}
	return err.Error()
}

func (b *Builder) ownLeftOut() {
	if !b.leftOwned {
		b.snap.leftOut = maps.Clone(b.snap.leftOut)
		if b.snap.leftOut == nil {
			b.snap.leftOut = map[string]LeftOut{}
		}
		b.leftOwned = true
	}
}
