package rls

import (
	"strings"
	"testing"
	"time"

	extv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/limiter"
	"github.com/ratelimitd/ratelimitd/limiter/bucketid"
	"github.com/ratelimitd/ratelimitd/limiter/rules"
)

func fuzzSnapshot(t testing.TB) *limiter.Snapshot {
	b := limiter.NewBuilder(limiter.Parsers{Canonical: bucketid.Canonical, ValidateRule: rules.Validate, IndexRules: rules.Index})
	for _, l := range []limiter.Limit{
		{Name: "PerIP", Enum: 1, IDFormat: limiter.IPAddress, Params: limiter.Params{Burst: 5, Count: 5, Period: time.Second}},
		{Name: "PerText", Enum: 2, IDFormat: limiter.String, Params: limiter.Params{Burst: 5, Count: 5, Period: time.Second}},
	} {
		if err := b.PutLimit(l); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range []limiter.Rule{
		{Domain: "d", Descriptor: []limiter.DescriptorEntry{{Key: "remote_address"}}, Limit: "PerIP"},
		{Domain: "d", Descriptor: []limiter.DescriptorEntry{{Key: "a"}, {Key: "b", Value: "x*"}}, Limit: "PerText"},
		{Domain: "d", Descriptor: []limiter.DescriptorEntry{{Key: "a", Value: "v"}}, Limit: "PerText"},
	} {
		r.ID = string(rune('A' + i))
		if err := b.PutRule(r); err != nil {
			t.Fatal(err)
		}
	}
	return b.Snapshot(1)
}

// FuzzTranslate feeds the request-to-batch translation arbitrary requests:
// it never panics, either refuses with an INVALID_ARGUMENT or gives one
// slot per descriptor, each bucket of a rule with a cost of at least 0.
// Descriptors are split from text: ';' between descriptors, ',' between
// entries, '=' between key and value.
func FuzzTranslate(f *testing.F) {
	f.Add("d", "remote_address=10.0.0.1;a=v", uint32(0), uint64(1), true)
	f.Add("d", "a=1,b=xy;a=1,b=xy", uint32(3), uint64(0), false)
	f.Add("", "", uint32(0), uint64(0), false)
	f.Add("d", "a=\xff", uint32(1<<31), uint64(1<<63), true)
	f.Add("d", "=v;a=v,,", uint32(2), uint64(0), true)
	snap := fuzzSnapshot(f)
	f.Fuzz(func(t *testing.T, domain, text string, requestHits uint32, hitsAddend uint64, ownHits bool) {
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: requestHits}
		for _, part := range strings.Split(text, ";") {
			d := &extv3.RateLimitDescriptor{}
			if ownHits {
				d.HitsAddend = wrapperspb.UInt64(hitsAddend)
			}
			for _, kv := range strings.Split(part, ",") {
				if kv == "" {
					continue
				}
				k, v, _ := strings.Cut(kv, "=")
				d.Entries = append(d.Entries, &extv3.RateLimitDescriptor_Entry{Key: k, Value: v})
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		var b batch
		err := b.translate(snap, req)
		if err != nil {
			if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || st.Message() == "" {
				t.Fatalf("error %v is not an INVALID_ARGUMENT", err)
			}
			return
		}
		if len(b.slot) != len(req.Descriptors) || len(b.rules) != len(b.reqs) {
			t.Fatalf("%d slots for %d descriptors, %d rules for %d buckets", len(b.slot), len(req.Descriptors), len(b.rules), len(b.reqs))
		}
		for _, j := range b.slot {
			if j < -1 || j >= len(b.reqs) {
				t.Fatalf("slot %d out of %d buckets", j, len(b.reqs))
			}
		}
		for j, r := range b.reqs {
			if r.Cost < 0 || r.Limit != b.rules[j].Limit {
				t.Fatalf("bucket %d: %+v of rule %+v", j, r, b.rules[j])
			}
			if b.find(r.Limit, r.BucketID) != j {
				t.Fatalf("bucket %d appears twice: %+v", j, b.reqs)
			}
		}
	})
}

func TestCurrentLimitNeverPanics(t *testing.T) {
	for _, p := range []limiter.Params{{}, {Count: 1}, {Period: time.Second}, {Count: 1 << 62, Period: 1}, {Count: 1, Period: 1 << 62}} {
		if l := currentLimit("L", p); l.GetRequestsPerUnit() == 0 {
			t.Errorf("%+v: %v", p, l)
		}
	}
}
