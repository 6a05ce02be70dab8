package limiter

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// shardCount splits the overrides of a snapshot so that an incremental
// change copies one shard (a few thousand entries at a million overrides)
// instead of the whole map.
const shardCount = 256

// Source says where the parameters of a decision came from.
type Source string

// The sources of a decision's parameters.
const (
	SourceDefault   Source = "default"
	SourceOverride  Source = "override"
	SourceUnlimited Source = "unlimited"
)

// limitEntry is a limit with its precomputed key prefix and, for a
// calendar quota, its zone.
type limitEntry struct {
	Limit
	prefix string
	zone   *time.Location
}

// overrideEntry is what a decision needs of an override, kept small because
// a snapshot may hold millions of them.
type overrideEntry struct {
	params    Params
	unlimited bool
	// expires is in Unix microseconds; 0 means never.
	expires int64
}

// Snapshot is an immutable view of every limit and every enabled override,
// read without locks by every decision and replaced as a whole when the
// database changes.
type Snapshot struct {
	version   int64
	byName    map[string]*limitEntry
	byEnum    map[int]*limitEntry
	shards    [shardCount]map[string]overrideEntry
	overrides int
	// rules are by id; ruleIdx is built from them (rules.go).
	rules   map[string]*Rule
	ruleIdx RuleMatcher
	parsers Parsers
	// leftOut are the rows left out, by leftKey (leftout.go).
	leftOut map[string]LeftOut
}

// Version is the database change sequence number the snapshot includes.
func (s *Snapshot) Version() int64 { return s.version }

// Overrides is the number of enabled overrides in the snapshot, expired ones
// included until the next full load.
func (s *Snapshot) Overrides() int { return s.overrides }

// Limit returns the limit called name.
func (s *Snapshot) Limit(name string) (Limit, bool) {
	e, ok := s.byName[name]
	if !ok {
		return Limit{}, false
	}
	return e.Limit, true
}

// Limits returns every limit, sorted by name.
func (s *Snapshot) Limits() []Limit {
	out := make([]Limit, 0, len(s.byName))
	for _, e := range s.byName {
		out = append(out, e.Limit)
	}
	slices.SortFunc(out, func(a, b Limit) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Resolution is a bucket as a decision sees it: its limit, canonical id,
// key, and the parameters in force.
type Resolution struct {
	Limit    *Limit
	BucketID string
	Key      string
	Params   Params
	Source   Source
	// zone is a calendar quota's time zone.
	zone *time.Location
}

// Resolve finds the limit called name, canonicalises bucketID and picks the
// parameters in force at now: the override of the bucket if it is enabled
// and not expired, else the limit's defaults. Its error is a FieldError
// naming "limit" or "bucket_id".
func (s *Snapshot) Resolve(name, bucketID string, now time.Time) (Resolution, error) {
	r, key, err := s.resolve(nil, name, bucketID, now.UnixMicro())
	r.Key = string(key)
	return r, err
}

// resolve is Resolve with the key appended to buf and returned as bytes
// instead of in r.Key, so that a decision allocates nothing for it.
func (s *Snapshot) resolve(buf []byte, name, bucketID string, nowUS int64) (Resolution, []byte, error) {
	e, ok := s.byName[name]
	if !ok {
		return Resolution{}, nil, FieldError{Field: "limit", Message: "unknown limit"}
	}
	id, err := s.parsers.Canonical(e.IDFormat, bucketID)
	if err != nil {
		return Resolution{}, nil, FieldError{Field: "bucket_id", Message: err.Error()}
	}
	key := appendKey(buf, e.prefix, e.IDFormat, id)
	r := Resolution{Limit: &e.Limit, BucketID: id, Params: e.Params, Source: SourceDefault, zone: e.zone}
	o, ok := s.override(key[len(buf):], nowUS)
	if !ok && e.IDFormat.AccountWide() {
		// The account's override, keyed like a bucket whose id is the
		// registration id alone, built on the stack: a registration id and
		// its prefix fit, so no decision allocates for it.
		account, _, _ := strings.Cut(id, ":")
		var a [64]byte
		o, ok = s.override(appendKey(a[:0], e.prefix, e.IDFormat, account), nowUS)
	}
	if ok {
		if o.unlimited {
			r.Source = SourceUnlimited
		} else {
			r.Params, r.Source = o.params, SourceOverride
		}
	}
	return r, key, nil
}

// override returns the override of a key if it applies at nowUS.
func (s *Snapshot) override(key []byte, nowUS int64) (overrideEntry, bool) {
	o, ok := s.shards[shardOf(key)][string(key)]
	return o, ok && (o.expires == 0 || nowUS < o.expires)
}

// shardOf hashes a key with FNV-1a, small enough to be inlined.
func shardOf[K string | []byte](key K) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % shardCount)
}

// Builder makes snapshots: from nothing for a full load, or from a previous
// snapshot for an incremental change, copying only the shards it changes.
// It is not safe for concurrent use.
type Builder struct {
	snap Snapshot
	// owned marks the maps this builder has copied and may write; the rest
	// are shared with earlier snapshots.
	owned       [shardCount]bool
	limitsOwned bool
	// rulesOwned and rulesChanged track the rules map (rules.go).
	rulesOwned   bool
	rulesChanged bool
	leftOwned    bool
}

// NewBuilder starts an empty snapshot that reads bucket ids and rules
// with p, which every snapshot built from it keeps. Each of p's functions
// is needed: a missing one is a wiring mistake, which panics here rather
// than on some later decision.
func NewBuilder(p Parsers) *Builder {
	if p.Canonical == nil || p.ValidateRule == nil || p.IndexRules == nil {
		panic("limiter: NewBuilder needs every function of Parsers")
	}
	b := &Builder{snap: Snapshot{byName: map[string]*limitEntry{}, byEnum: map[int]*limitEntry{}, parsers: p}}
	b.limitsOwned = true
	for i := range b.snap.shards {
		b.snap.shards[i] = map[string]overrideEntry{}
		b.owned[i] = true
	}
	return b
}

// Builder starts a snapshot that begins as a copy of s.
func (s *Snapshot) Builder() *Builder {
	return &Builder{snap: *s}
}

// PutLimit adds l or replaces the limit of the same name. A limit's enum and,
// while it has overrides, its id format never change; the database enforces
// that, and PutLimit refuses an enum taken by another limit. A replacement
// with another generation gets new bucket keys from here on: the limit was
// deleted and created again, or it is a quota whose calendar or zone
// changed, whose usage would otherwise be read against other windows. The
// overrides it still has move to its new keys.
//
// A limit refused is recorded as left out (LeftOut); a previous version of
// it stays, with its overrides and rules, which only a full load sorts out
// (see Apply).
func (b *Builder) PutLimit(l Limit) error {
	err := b.putLimit(l)
	b.leave(EntityLimit, l.Name, "", err)
	return err
}

func (b *Builder) putLimit(l Limit) error {
	fe := l.Validate()
	if l.Enum == 0 {
		fe = append(fe, FieldError{Field: "enum", Message: "must be at least 1"})
	}
	if len(fe) > 0 {
		return fmt.Errorf("limit %q: %w", l.Name, &ValidationError{Fields: fe})
	}
	if other, ok := b.snap.byEnum[l.Enum]; ok && other.Name != l.Name {
		return fmt.Errorf("enum %d is taken by limit %s: %w", l.Enum, other.Name, ErrConflict)
	}
	b.ownLimits()
	e := &limitEntry{Limit: l, prefix: keyPrefix(l.Enum, l.Generation)}
	if old, ok := b.snap.byName[l.Name]; ok {
		delete(b.snap.byEnum, old.Enum)
		if old.prefix != e.prefix {
			b.moveOverrides(old.prefix, e.prefix)
		}
	}
	if l.Quota() {
		e.zone, _ = LoadZone(l.TimeZone) // Validate loaded it already
	}
	b.snap.byName[l.Name] = e
	b.snap.byEnum[l.Enum] = e
	return nil
}

// moveOverrides rekeys the overrides under one key prefix to another. It
// reads every shard, since keys are spread by their hash: a cost paid only
// when a limit that has overrides changes generation, which is rare (the
// limit deleted and created again has none left).
func (b *Builder) moveOverrides(from, to string) {
	moved := map[string]overrideEntry{}
	for i := range b.snap.shards {
		for key, o := range b.snap.shards[i] {
			if strings.HasPrefix(key, from) {
				moved[key] = o
			}
		}
	}
	for key := range moved {
		delete(b.ownShard(key), key)
	}
	for key, o := range moved {
		nk := to + key[len(from):]
		b.ownShard(nk)[nk] = o
	}
}

// DeleteLimit removes the limit called name. Its overrides must be gone
// already, as the database ensures.
func (b *Builder) DeleteLimit(name string) {
	old, ok := b.snap.byName[name]
	if !ok {
		return
	}
	b.ownLimits()
	delete(b.snap.byName, name)
	delete(b.snap.byEnum, old.Enum)
}

// forget drops what the snapshot recorded of a row deleted from the
// database: it is no longer left out.
func (b *Builder) forget(entity, id string) { b.leave(entity, id, "", nil) }

// PutOverride adds o or replaces the override of its bucket; a disabled
// override is removed, as it never applies. o.BucketID must be canonical.
// Invalid parameters are refused, so that no decision can divide by zero:
// the override is then recorded as left out (LeftOut), and its previous
// version, if any, removed.
func (b *Builder) PutOverride(o Override) error {
	if !o.Enabled {
		// Never in force, so never left out.
		b.forget(EntityOverride, o.ID)
		return b.DeleteOverride(o.Limit, o.BucketID)
	}
	err := b.putOverride(o)
	if err != nil {
		_ = b.DeleteOverride(o.Limit, o.BucketID) // of an unknown limit: none
	}
	b.leave(EntityOverride, o.ID, o.Limit, err)
	return err
}

func (b *Builder) putOverride(o Override) error {
	key, err := b.key(o.Limit, o.BucketID)
	if err != nil {
		return err
	}
	if fe := b.snap.byName[o.Limit].ParamsProblems(o.Params, true); len(fe) > 0 && !o.Unlimited {
		return fmt.Errorf("override of %q for %q: %w", o.Limit, o.BucketID, &ValidationError{Fields: fe})
	}
	var expires int64
	if !o.ExpiresAt.IsZero() {
		expires = o.ExpiresAt.UnixMicro()
	}
	shard := b.ownShard(key)
	if _, ok := shard[key]; !ok {
		b.snap.overrides++
	}
	shard[key] = overrideEntry{params: o.Params, unlimited: o.Unlimited, expires: expires}
	return nil
}

// DeleteOverride removes the override of a bucket, if any.
func (b *Builder) DeleteOverride(limit, bucketID string) error {
	key, err := b.key(limit, bucketID)
	if err != nil {
		return err
	}
	if _, ok := b.snap.shards[shardOf(key)][key]; !ok {
		return nil
	}
	delete(b.ownShard(key), key)
	b.snap.overrides--
	return nil
}

// Snapshot returns the snapshot built so far. The builder stays usable:
// later changes copy the maps again and never touch the returned snapshot.
func (b *Builder) Snapshot(version int64) *Snapshot {
	b.indexRules()
	s := b.snap
	s.version = version
	b.owned = [shardCount]bool{}
	b.limitsOwned, b.leftOwned = false, false
	return &s
}

func (b *Builder) key(limit, bucketID string) (string, error) {
	e, ok := b.snap.byName[limit]
	if !ok {
		return "", fmt.Errorf("override of unknown limit %q: %w", limit, ErrNotFound)
	}
	return bucketKey(e.prefix, e.IDFormat, bucketID), nil
}

func (b *Builder) ownShard(key string) map[string]overrideEntry {
	i := shardOf(key)
	if !b.owned[i] {
		b.snap.shards[i] = maps.Clone(b.snap.shards[i])
		b.owned[i] = true
	}
	return b.snap.shards[i]
}

func (b *Builder) ownLimits() {
	if b.limitsOwned {
		return
	}
	b.snap.byName = maps.Clone(b.snap.byName)
	b.snap.byEnum = maps.Clone(b.snap.byEnum)
	b.limitsOwned = true
}

// Changes is what changed in the database after a snapshot's version: the
// current state of every limit and override written since, and the ones
// deleted.
type Changes struct {
	// Version is the change sequence number the changes bring a snapshot to.
	Version int64
	Limits  []Limit
	// DeletedLimits are names.
	DeletedLimits []string
	Overrides     []Override
	// DeletedOverrides need only Limit and BucketID.
	DeletedOverrides []Override
	Rules            []Rule
	// DeletedRules are ids.
	DeletedRules []string
	// Tokens reports that a token was created or revoked. Tokens are no
	// part of a snapshot; whoever keeps them rereads them.
	Tokens bool
}

// Empty reports whether c changes nothing but the version.
func (c Changes) Empty() bool {
	return len(c.Limits)+len(c.DeletedLimits)+len(c.Overrides)+len(c.DeletedOverrides)+len(c.Rules)+len(c.DeletedRules) == 0
}

// Apply makes the changes. Deletions go first: a current override always
// wins over a deleted one of the same bucket, and a limit is deleted only
// after its overrides. An override or rule this version cannot use is left
// out (LeftOut), and the rest applied. A limit left out, or one that was
// left out and comes back, changes what its overrides and rules are: Apply
// then stops and reports that only a full load gets the snapshot right.
func (b *Builder) Apply(c Changes) (full bool) {
	for _, o := range c.DeletedOverrides {
		b.forget(EntityOverride, o.ID)
		if _, ok := b.snap.byName[o.Limit]; ok {
			_ = b.DeleteOverride(o.Limit, o.BucketID) // its limit is known: no error
		}
	}
	for _, id := range c.DeletedRules {
		b.DeleteRule(id)
	}
	for _, name := range c.DeletedLimits {
		b.DeleteLimit(name)
		b.forget(EntityLimit, name)
	}
	for _, l := range c.Limits {
		_, wasLeftOut := b.snap.leftOut[leftKey(EntityLimit, l.Name)]
		if err := b.PutLimit(l); err != nil || wasLeftOut {
			return true
		}
	}
	for _, o := range c.Overrides {
		_ = b.PutOverride(o)
	}
	for _, r := range c.Rules {
		_ = b.PutRule(r)
	}
	return false
}
