package limitfile

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
)

// fakeStore is an in-memory Store that imports as db.DB.Import documents:
// limits upserted by name (enums kept, assigned from 100 when 0, never
// shared), overrides upserted by limit and bucket id (keeping enabled), and
// the same conflicts. Full walks the overrides in map order, so that a test
// of Export also tests that its output does not depend on the store's order.
type fakeStore struct {
	mu        sync.Mutex
	limits    map[string]limiter.Limit
	overrides map[bucket]limiter.Override
	nextID    int
	imports   int
	// err, when set, is returned by every method.
	err error
}

func newFakeStore(limits ...limiter.Limit) *fakeStore {
	s := &fakeStore{limits: map[string]limiter.Limit{}, overrides: map[bucket]limiter.Override{}}
	for _, l := range limits {
		s.limits[l.Name] = l
	}
	return s
}

// withOverride stores o as given (enabled as given), for setting up tests.
func (s *fakeStore) withOverride(o limiter.Override) *fakeStore {
	s.nextID++
	o.ID = strconv.Itoa(s.nextID)
	s.overrides[bucket{o.Limit, o.BucketID}] = o
	return s
}

func (s *fakeStore) ListLimits(context.Context) ([]limiter.Limit, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	out := slices.Collect(maps.Values(s.limits))
	slices.SortFunc(out, func(a, b limiter.Limit) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

func (s *fakeStore) OverrideCounts(context.Context) (map[string]int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	counts := map[string]int{}
	for k := range s.overrides {
		counts[k.limit]++
	}
	return counts, nil
}

func (s *fakeStore) Import(_ context.Context, _ string, limits []limiter.Limit, overrides []limiter.Override, dryRun bool) (limiter.ImportCounts, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return limiter.ImportCounts{}, s.err
	}
	s.imports++
	ls := maps.Clone(s.limits)
	os := maps.Clone(s.overrides)
	nextID := s.nextID
	var c limiter.ImportCounts
	hasOverrides := func(name string) bool {
		for k := range os {
			if k.limit == name {
				return true
			}
		}
		return false
	}
	for _, l := range limits {
		old, ok := ls[l.Name]
		if !ok {
			if l.Enum == 0 {
				l.Enum = limiter.FirstAssignedEnum
				for _, x := range ls {
					if x.Enum >= l.Enum {
						l.Enum = x.Enum + 1
					}
				}
			}
			for _, x := range ls {
				if x.Enum == l.Enum {
					return limiter.ImportCounts{}, fmt.Errorf("enum %d is taken: %w", l.Enum, limiter.ErrConflict)
				}
			}
			ls[l.Name] = l
			c.Created++
			continue
		}
		if l.Enum != 0 && l.Enum != old.Enum {
			return limiter.ImportCounts{}, fmt.Errorf("limit %s: enum changes: %w", l.Name, limiter.ErrConflict)
		}
		l.Enum, l.CreatedAt, l.UpdatedAt = old.Enum, old.CreatedAt, old.UpdatedAt
		if l == old {
			c.Unchanged++
			continue
		}
		if l.IDFormat != old.IDFormat && hasOverrides(l.Name) {
			return limiter.ImportCounts{}, fmt.Errorf("limit %s: id_format changes: %w", l.Name, limiter.ErrConflict)
		}
		ls[l.Name] = l
		c.Updated++
	}
	seen := map[bucket]bool{}
	for _, o := range overrides {
		l, ok := ls[o.Limit]
		if !ok {
			return limiter.ImportCounts{}, fmt.Errorf("limit %s: %w", o.Limit, limiter.ErrNotFound)
		}
		id, err := bucketid.CanonicalOverride(l.IDFormat, o.BucketID)
		if err != nil {
			return limiter.ImportCounts{}, fmt.Errorf("limit %s: %w", o.Limit, limiter.ErrConflict)
		}
		o.BucketID = id
		k := bucket{o.Limit, o.BucketID}
		if seen[k] {
			return limiter.ImportCounts{}, fmt.Errorf("%v twice: %w", k, limiter.ErrConflict)
		}
		seen[k] = true
		if o.Unlimited {
			o.Params = limiter.Params{}
		}
		old, ok := os[k]
		if !ok {
			nextID++
			o.ID, o.Enabled = strconv.Itoa(nextID), true
			os[k] = o
			c.Created++
			continue
		}
		if old.Params == o.Params && old.Unlimited == o.Unlimited && old.Comment == o.Comment {
			c.Unchanged++
			continue
		}
		old.Params, old.Unlimited, old.Comment = o.Params, o.Unlimited, o.Comment
		os[k] = old
		c.Updated++
	}
	if !dryRun {
		s.limits, s.overrides, s.nextID = ls, os, nextID
	}
	return c, nil
}

func (s *fakeStore) Full(_ context.Context, onLimit func(limiter.Limit) error, onOverride func(limiter.Override) error) (int64, error) {
	limits, err := s.ListLimits(context.Background())
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	overrides := slices.Collect(maps.Values(s.overrides))
	s.mu.Unlock()
	for _, l := range limits {
		if err := onLimit(l); err != nil {
			return 0, err
		}
	}
	for _, o := range overrides {
		if !o.Enabled {
			continue
		}
		if err := onOverride(o); err != nil {
			return 0, err
		}
	}
	return 1, nil
}

// state is everything the store holds, to compare before and after.
func (s *fakeStore) state() (map[string]limiter.Limit, map[bucket]limiter.Override) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.limits), maps.Clone(s.overrides)
}
