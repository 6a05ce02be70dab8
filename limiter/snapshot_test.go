package limiter_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func orders() limiter.Limit {
	return limiter.Limit{Name: "NewOrdersPerAccount", Enum: 3, IDFormat: limiter.RegID,
		Params: limiter.Params{Burst: 300, Count: 300, Period: 3 * time.Hour}}
}

func emails() limiter.Limit {
	return limiter.Limit{Name: "MailsPerAddress", Enum: 100, IDFormat: limiter.String,
		Params: limiter.Params{Burst: 5, Count: 5, Period: time.Hour}}
}

func override(limit, id string, burst int64) limiter.Override {
	return limiter.Override{Limit: limit, BucketID: id, Enabled: true,
		Params: limiter.Params{Burst: burst, Count: max(burst, 1), Period: time.Hour}}
}

func build(t *testing.T, limits []limiter.Limit, overrides ...limiter.Override) *limiter.Snapshot {
	t.Helper()
	b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	for _, l := range limits {
		if err := b.PutLimit(l); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range overrides {
		if err := b.PutOverride(o); err != nil {
			t.Fatal(err)
		}
	}
	return b.Snapshot(1)
}

func resolve(t *testing.T, s *limiter.Snapshot, limit, id string, at time.Time) limiter.Resolution {
	t.Helper()
	r, err := s.Resolve(limit, id, at)
	if err != nil {
		t.Fatalf("Resolve(%q, %q): %v", limit, id, err)
	}
	return r
}

func TestResolvePicksOverrideOrDefault(t *testing.T) {
	expiring := override("NewOrdersPerAccount", "7", 20)
	expiring.ExpiresAt = t0.Add(time.Hour)
	disabled := override("NewOrdersPerAccount", "8", 30)
	disabled.Enabled = false
	unlimited := limiter.Override{Limit: "NewOrdersPerAccount", BucketID: "9", Enabled: true, Unlimited: true}
	s := build(t, []limiter.Limit{orders()}, override("NewOrdersPerAccount", "42", 600), expiring, disabled, unlimited)

	tests := []struct {
		name   string
		id     string
		at     time.Time
		source limiter.Source
		burst  int64
	}{
		{"no override", "12345678", t0, limiter.SourceDefault, 300},
		{"an override, written with leading zeros", "0042", t0, limiter.SourceOverride, 600},
		{"an override before it expires", "7", t0.Add(time.Hour - time.Microsecond), limiter.SourceOverride, 20},
		{"an override when it expires", "7", t0.Add(time.Hour), limiter.SourceDefault, 300},
		{"a disabled override", "8", t0, limiter.SourceDefault, 300},
		{"an unlimited override", "9", t0, limiter.SourceUnlimited, 300},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := resolve(t, s, "NewOrdersPerAccount", tc.id, tc.at)
			if r.Source != tc.source || r.Params.Burst != tc.burst {
				t.Fatalf("source %s burst %d, want %s %d", r.Source, r.Params.Burst, tc.source, tc.burst)
			}
		})
	}
	if s.Overrides() != 3 {
		t.Fatalf("Overrides() = %d, want 3 (the disabled one is left out)", s.Overrides())
	}
}

func TestResolveErrorsNameTheField(t *testing.T) {
	s := build(t, []limiter.Limit{orders()})
	for _, tc := range []struct{ limit, id, field string }{
		{"NoSuchLimit", "1", "limit"},
		{"NewOrdersPerAccount", "-1", "bucket_id"},
		{"NewOrdersPerAccount", "", "bucket_id"},
	} {
		_, err := s.Resolve(tc.limit, tc.id, t0)
		var fe limiter.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || fe.Message == "" {
			t.Errorf("Resolve(%q, %q) = %v, want an error on %s", tc.limit, tc.id, err, tc.field)
		}
	}
}

func TestHashedKeysHideTheID(t *testing.T) {
	s := build(t, []limiter.Limit{emails()}, override("MailsPerAddress", "alice@example.com", 50))
	r := resolve(t, s, "MailsPerAddress", "alice@example.com", t0)
	if r.Source != limiter.SourceOverride {
		t.Fatalf("the override of a hashed id was not found: %+v", r)
	}
	if strings.Contains(r.Key, "alice") || !strings.HasPrefix(r.Key, "100:#") {
		t.Fatalf("key %q shows the id or lacks the limit's prefix", r.Key)
	}
	if other := resolve(t, s, "MailsPerAddress", "bob@example.com", t0); other.Key == r.Key {
		t.Fatal("two ids share a key")
	}
}

func TestBuilderCopiesOnWrite(t *testing.T) {
	s1 := build(t, []limiter.Limit{orders()}, override("NewOrdersPerAccount", "1", 10))

	b := s1.Builder()
	if err := b.PutOverride(override("NewOrdersPerAccount", "2", 20)); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteOverride("NewOrdersPerAccount", "1"); err != nil {
		t.Fatal(err)
	}
	s2 := b.Snapshot(2)
	// Writing on after Snapshot must not reach s2.
	if err := b.PutOverride(override("NewOrdersPerAccount", "3", 30)); err != nil {
		t.Fatal(err)
	}
	s3 := b.Snapshot(3)

	for _, tc := range []struct {
		s    *limiter.Snapshot
		id   string
		want limiter.Source
	}{
		{s1, "1", limiter.SourceOverride}, {s1, "2", limiter.SourceDefault}, {s1, "3", limiter.SourceDefault},
		{s2, "1", limiter.SourceDefault}, {s2, "2", limiter.SourceOverride}, {s2, "3", limiter.SourceDefault},
		{s3, "1", limiter.SourceDefault}, {s3, "2", limiter.SourceOverride}, {s3, "3", limiter.SourceOverride},
	} {
		if got := resolve(t, tc.s, "NewOrdersPerAccount", tc.id, t0).Source; got != tc.want {
			t.Errorf("snapshot %d, bucket %s: %s, want %s", tc.s.Version(), tc.id, got, tc.want)
		}
	}
	if s1.Overrides() != 1 || s2.Overrides() != 1 || s3.Overrides() != 2 {
		t.Fatalf("counts %d %d %d, want 1 1 2", s1.Overrides(), s2.Overrides(), s3.Overrides())
	}
}

func TestApplyChanges(t *testing.T) {
	s1 := build(t, []limiter.Limit{orders(), emails()}, override("NewOrdersPerAccount", "1", 10), override("MailsPerAddress", "a@b.c", 9))
	recreated := override("NewOrdersPerAccount", "1", 99)
	raised := orders()
	raised.Burst = 1000
	b := s1.Builder()
	full := b.Apply(limiter.Changes{
		Version:          7,
		Limits:           []limiter.Limit{raised},
		DeletedLimits:    []string{"MailsPerAddress"},
		Overrides:        []limiter.Override{recreated},
		DeletedOverrides: []limiter.Override{{Limit: "NewOrdersPerAccount", BucketID: "1"}, {Limit: "MailsPerAddress", BucketID: "a@b.c"}},
	})
	if full {
		t.Fatal("changes of usable rows need a full load")
	}
	s2 := b.Snapshot(7)
	if r := resolve(t, s2, "NewOrdersPerAccount", "1", t0); r.Params.Burst != 99 {
		t.Fatalf("the recreated override lost to its deletion: %+v", r)
	}
	if r := resolve(t, s2, "NewOrdersPerAccount", "2", t0); r.Params.Burst != 1000 {
		t.Fatalf("the raised default is not in force: %+v", r)
	}
	if _, ok := s2.Limit("MailsPerAddress"); ok {
		t.Fatal("the deleted limit is still there")
	}
	if _, ok := s1.Limit("MailsPerAddress"); !ok {
		t.Fatal("applying changes altered the old snapshot")
	}
	if s2.Overrides() != 1 {
		t.Fatalf("Overrides() = %d, want 1", s2.Overrides())
	}
}

func TestPutLimitRefusesATakenEnum(t *testing.T) {
	b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	if err := b.PutLimit(orders()); err != nil {
		t.Fatal(err)
	}
	other := emails()
	other.Enum = 3
	if err := b.PutLimit(other); !errors.Is(err, limiter.ErrConflict) {
		t.Fatalf("PutLimit with a taken enum: %v", err)
	}
	if err := b.PutOverride(override("Nope", "1", 1)); !errors.Is(err, limiter.ErrNotFound) {
		t.Fatalf("an override of an unknown limit: %v", err)
	}
}

// TestAccountWideOverride: an override of a per-account limit written with
// the registration id alone covers every bucket of the account that has no
// override of its own, as Boulder's overrides of these limits are written.
func TestAccountWideOverride(t *testing.T) {
	l := limiter.Limit{Name: "FailedAuthorizationsPerDomainPerAccount", Enum: 4, IDFormat: limiter.RegIDDomain,
		Params: limiter.Params{Burst: 5, Count: 5, Period: time.Hour}}
	account := override(l.Name, "0042", 50)
	if fe := bucketid.NormalizeOverride(&account, l); len(fe) > 0 || account.BucketID != "42" {
		t.Fatalf("an account-wide id: %v %q", fe, account.BucketID)
	}
	own := override(l.Name, "42:Example.COM", 7)
	if fe := bucketid.NormalizeOverride(&own, l); len(fe) > 0 || own.BucketID != "42:example.com" {
		t.Fatalf("a bucket's own id: %v %q", fe, own.BucketID)
	}
	s := build(t, []limiter.Limit{l}, account, own)
	for _, tc := range []struct {
		id    string
		burst int64
	}{
		{"42:example.com", 7},   // its own override wins
		{"42:example.org", 50},  // the account's
		{"042:EXAMPLE.net", 50}, // in any notation
		{"43:example.org", 5},   // another account: the default
	} {
		if got := resolve(t, s, l.Name, tc.id, t0).Params.Burst; got != tc.burst {
			t.Errorf("%s: burst %d, want %d", tc.id, got, tc.burst)
		}
	}
	if _, err := s.Resolve(l.Name, "42", t0); err == nil {
		t.Error("a decision on a bare account id was accepted; decisions name a bucket")
	}
	plain := orders()
	bare := override(plain.Name, "x:1", 1)
	if fe := bucketid.NormalizeOverride(&bare, plain); len(fe) == 0 {
		t.Error("reg_id accepted an id with a colon")
	}
}

// TestGenerationsSeparateBuckets re-creates a limit under its enum, as a
// catalogue name deleted and created again is: its buckets and overrides
// get other keys than the deleted limit's, and the first generation keeps
// the keys written before generations existed.
func TestGenerationsSeparateBuckets(t *testing.T) {
	first := orders()
	first.Generation = 1
	s := build(t, []limiter.Limit{first}, override("NewOrdersPerAccount", "42", 600))
	if r := resolve(t, s, "NewOrdersPerAccount", "42", t0); r.Key != "3:42" || r.Source != limiter.SourceOverride {
		t.Fatalf("first generation: key %q, source %s; want 3:42 from the override", r.Key, r.Source)
	}

	// Deleted and created again between two loads, the limit comes as the
	// database reports it: among the current limits, not the deleted ones,
	// after its overrides were deleted.
	second := orders()
	second.Generation = 2
	b := s.Builder()
	full := b.Apply(limiter.Changes{
		Version:          3,
		Limits:           []limiter.Limit{second},
		DeletedOverrides: []limiter.Override{{Limit: "NewOrdersPerAccount", BucketID: "42"}},
	})
	if full {
		t.Fatal("changes of usable rows need a full load")
	}
	s2 := b.Snapshot(3)
	if r := resolve(t, s2, "NewOrdersPerAccount", "42", t0); r.Key != "3.2:42" || r.Source != limiter.SourceDefault {
		t.Errorf("second generation: key %q, source %s; want 3.2:42 from the defaults", r.Key, r.Source)
	}
	if r := resolve(t, s, "NewOrdersPerAccount", "42", t0); r.Key != "3:42" {
		t.Errorf("the earlier snapshot changed: key %q", r.Key)
	}
}

// TestNewBuilderNeedsEveryParser: a builder missing a parser is a wiring
// mistake, refused where it is made rather than on a later decision.
func TestNewBuilderNeedsEveryParser(t *testing.T) {
	all := limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index}
	for name, p := range map[string]limiter.Parsers{
		"Canonical":    {ValidateRule: all.ValidateRule, IndexRules: all.IndexRules},
		"ValidateRule": {Canonical: all.Canonical, IndexRules: all.IndexRules},
		"IndexRules":   {Canonical: all.Canonical, ValidateRule: all.ValidateRule},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewBuilder without %s did not panic", name)
				}
			}()
			limiter.NewBuilder(p)
		}()
	}
	limiter.NewBuilder(all) // and with all of them it does not
}

// TestNewGenerationMovesOverrides: a quota whose calendar changed gets a
// new generation while it keeps its overrides (the database bumps it so
// that usage restarts in the new windows); an incremental change that
// brings the new generation must find the overrides under the new keys,
// though the change log does not report them again.
func TestNewGenerationMovesOverrides(t *testing.T) {
	daily := quota("Exports", 120, limiter.CalendarDay, "UTC", 10)
	daily.Generation = 1
	raised := limiter.Override{Limit: "Exports", BucketID: "acct-1", Enabled: true, Params: limiter.Params{Burst: 50, Count: 50}}
	s := build(t, []limiter.Limit{daily, emails()}, raised, override("MailsPerAddress", "a@b.c", 9))

	weekly := daily
	weekly.Calendar, weekly.Generation = limiter.CalendarWeek, 2
	b := s.Builder()
	if b.Apply(limiter.Changes{Version: 2, Limits: []limiter.Limit{weekly}}) {
		t.Fatal("changes of usable rows need a full load")
	}
	s2 := b.Snapshot(2)
	r := resolve(t, s2, "Exports", "acct-1", t0)
	if !strings.HasPrefix(r.Key, "120.2:") || r.Source != limiter.SourceOverride || r.Params.Count != 50 {
		t.Errorf("after the new generation: key %q, source %s, count %d; want a key of generation 2 and the override's count (50)", r.Key, r.Source, r.Params.Count)
	}
	if r := resolve(t, s2, "MailsPerAddress", "a@b.c", t0); r.Source != limiter.SourceOverride {
		t.Errorf("another limit's override moved: %+v", r)
	}
	if s2.Overrides() != 2 {
		t.Errorf("Overrides() = %d, want 2", s2.Overrides())
	}
	if r := resolve(t, s, "Exports", "acct-1", t0); !strings.HasPrefix(r.Key, "120:") || r.Source != limiter.SourceOverride {
		t.Errorf("the earlier snapshot changed: key %q, source %s", r.Key, r.Source)
	}
}

// TestApplyLeavesOutWhatItCannotUse: an incremental change that brings
// an override or a rule this version cannot use leaves it out, with its
// previous version, and applies the rest; one that leaves a limit out, or
// brings back a limit left out, asks for a full load, which alone knows
// that limit's overrides and rules. A deleted row is no longer reported.
func TestApplyLeavesOutWhatItCannotUse(t *testing.T) {
	kept := override("MailsPerAddress", "a@b.c", 9)
	kept.ID = "o1"
	s := build(t, []limiter.Limit{orders(), emails()}, kept)

	bad := kept
	bad.Count, bad.Period = 1_000_000_000, time.Nanosecond
	raised := orders()
	raised.Burst = 400
	b := s.Builder()
	if b.Apply(limiter.Changes{Version: 2, Limits: []limiter.Limit{raised}, Overrides: []limiter.Override{bad}}) {
		t.Fatal("a change of usable limits asks for a full load")
	}
	s2 := b.Snapshot(2)
	if r := resolve(t, s2, "MailsPerAddress", "a@b.c", t0); r.Source != limiter.SourceDefault {
		t.Errorf("the override's previous version is still in force: %+v", r)
	}
	if r := resolve(t, s2, "NewOrdersPerAccount", "1", t0); r.Params.Burst != 400 {
		t.Errorf("the rest of the change was not applied: %+v", r)
	}
	if got := s2.LeftOut(); len(got) != 1 || got[0].Entity != limiter.EntityOverride || got[0].ID != "o1" || got[0].Limit != "MailsPerAddress" ||
		!strings.HasPrefix(got[0].Reason, "period: ") {
		t.Errorf("left out %+v", got)
	}
	if len(s.LeftOut()) != 0 {
		t.Errorf("the earlier snapshot changed: %+v", s.LeftOut())
	}

	zoned := emails()
	zoned.Calendar, zoned.TimeZone, zoned.Period = limiter.CalendarDay, "localtime", 0
	if !s2.Builder().Apply(limiter.Changes{Version: 3, Limits: []limiter.Limit{zoned}}) {
		t.Error("a limit left out does not ask for a full load")
	}
	full := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	_ = full.PutLimit(zoned)
	_ = full.PutOverride(kept)
	s3 := full.Snapshot(3)
	if got := s3.LeftOut(); len(got) != 2 || got[1].Reason != "its limit MailsPerAddress is left out" {
		t.Errorf("left out %+v", got)
	}
	if !s3.Builder().Apply(limiter.Changes{Version: 4, Limits: []limiter.Limit{emails()}}) {
		t.Error("a limit back from being left out does not ask for a full load")
	}
	b = s3.Builder()
	b.Apply(limiter.Changes{Version: 4, DeletedOverrides: []limiter.Override{kept}})
	if got := b.Snapshot(4).LeftOut(); len(got) != 1 || got[0].Entity != limiter.EntityLimit {
		t.Errorf("after the override's deletion, left out %+v", got)
	}
}
