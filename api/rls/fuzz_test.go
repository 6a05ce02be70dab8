package rls

import (
	"bytes"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
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
		if b.Len() != len(req.Descriptors) {
			t.Fatalf("%d descriptors added of %d", b.Len(), len(req.Descriptors))
		}
		// One bucket is one request of the batch, whichever descriptors
		// name it.
		bucket := map[[2]string]int{}
		for i := range req.Descriptors {
			m, ok := b.Matched(i)
			j := b.Decision(i)
			if !ok {
				if j != -1 {
					t.Fatalf("descriptor %d matched nothing, yet has bucket %d", i, j)
				}
				continue
			}
			k := [2]string{m.Rule.Limit, m.BucketID}
			if first, seen := bucket[k]; seen && first != j || !seen && slices.Contains(slices.Collect(maps.Values(bucket)), j) {
				t.Fatalf("descriptor %d: bucket %v is request %d, already %v", i, k, j, bucket)
			}
			bucket[k] = j
		}
	})
}

func TestCurrentLimitNeverPanics(t *testing.T) {
	for _, p := range []limiter.Params{{}, {Count: 1}, {Period: time.Second}, {Count: 1 << 62, Period: 1}, {Count: 1, Period: 1 << 62}} {
		l := &rlsv3.RateLimitResponse_RateLimit{}
		if setCurrentLimit(l, "L", p); l.GetRequestsPerUnit() == 0 {
			t.Errorf("%+v: %v", p, l)
		}
	}
}

// FuzzDecodeRequest: whatever bytes protobuf reads as a RateLimitRequest,
// the codec reads too, with the same fields that ShouldRateLimit uses.
func FuzzDecodeRequest(f *testing.F) {
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "d", HitsAddend: 3, Descriptors: []*extv3.RateLimitDescriptor{
			{Entries: []*extv3.RateLimitDescriptor_Entry{{Key: "a", Value: "v"}, {Key: "b"}}, HitsAddend: wrapperspb.UInt64(7), IsNegativeHits: true,
				Limit: &extv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}},
			{Entries: []*extv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}, HitsAddend: wrapperspb.UInt64(0)},
		}},
		{},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		// A field given twice: the last scalar wins, messages merge.
		f.Add(append(b, b...))
	}
	// One descriptor's hits_addend twice, the second empty: merged, 5.
	f.Add([]byte{0x12, 0x06, 0x1a, 0x02, 0x08, 0x05, 0x1a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		var want rlsv3.RateLimitRequest
		if proto.Unmarshal(b, &want) != nil {
			return
		}
		var got rlsv3.RateLimitRequest
		if err := newCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err != nil {
			t.Fatalf("protobuf reads %x as %v; the codec fails: %v", b, &want, err)
		}
		if w, g := usedFields(&want), usedFields(&got); !proto.Equal(w, g) {
			t.Fatalf("%x: protobuf reads %v, the codec %v", b, w, g)
		}
	})
}

// usedFields is a copy of a request with only the fields ShouldRateLimit
// reads.
func usedFields(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitRequest {
	out := &rlsv3.RateLimitRequest{Domain: req.GetDomain(), HitsAddend: req.GetHitsAddend()}
	for _, d := range req.GetDescriptors() {
		c := &extv3.RateLimitDescriptor{HitsAddend: d.GetHitsAddend(), IsNegativeHits: d.GetIsNegativeHits()}
		if c.HitsAddend != nil {
			c.HitsAddend = wrapperspb.UInt64(c.HitsAddend.GetValue())
		}
		for _, e := range d.GetEntries() {
			c.Entries = append(c.Entries, &extv3.RateLimitDescriptor_Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		out.Descriptors = append(out.Descriptors, c)
	}
	return out
}

// BenchmarkUnmarshal compares the codec's reading of a request of three
// descriptors with protobuf's.
func BenchmarkUnmarshal(b *testing.B) {
	req := &rlsv3.RateLimitRequest{Domain: "envoy"}
	for _, k := range []string{"remote_address", "path", "user"} {
		req.Descriptors = append(req.Descriptors, &extv3.RateLimitDescriptor{Entries: []*extv3.RateLimitDescriptor_Entry{{Key: k, Value: "some value of " + k}}})
	}
	data, err := proto.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		c := newCodec()
		for b.Loop() {
			if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, &rlsv3.RateLimitRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("protobuf", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(data, &rlsv3.RateLimitRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzMarshalResponse: the codec writes an answer of ShouldRateLimit's
// fields byte for byte as protobuf does, and leaves one with other fields
// to protobuf.
func FuzzMarshalResponse(f *testing.F) {
	f.Add(int32(1), int32(2), uint32(7), uint32(100), int32(3), "Limit", int64(59), int32(999999999), "RateLimit", `"Limit";r=7;t=59`, true, true)
	f.Add(int32(0), int32(0), uint32(0), uint32(0), int32(0), "", int64(0), int32(0), "", "", false, false)
	f.Add(int32(-1), int32(-5), uint32(1<<32-1), uint32(1), int32(-2), "L", int64(-1), int32(-1), "k", "v", true, false)
	f.Fuzz(func(t *testing.T, overall, code int32, remaining, perUnit uint32, unit int32, name string, seconds int64, nanos int32, key, value string, withLimit, withReset bool) {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(code), LimitRemaining: remaining}
		if withLimit {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: perUnit, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(unit)}
		}
		if withReset {
			st.DurationUntilReset = &durationpb.Duration{Seconds: seconds, Nanos: nanos}
		}
		resp := &rlsv3.RateLimitResponse{
			OverallCode:          rlsv3.RateLimitResponse_Code(overall),
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{st, {Code: rlsv3.RateLimitResponse_OK}},
			ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: key, Value: value}, {Key: "Retry-After", Value: "1"}},
		}
		want, werr := proto.Marshal(resp)
		got, gerr := newCodec().Marshal(resp)
		if werr != nil {
			return // not UTF-8: protobuf refuses, and ShouldRateLimit never writes such strings
		}
		if gerr != nil || !bytes.Equal(got.Materialize(), want) {
			t.Fatalf("codec %x, %v; protobuf %x", got.Materialize(), gerr, want)
		}
		// A field the codec does not write: protobuf writes the answer.
		resp.RawBody = []byte(value)
		want, _ = proto.Marshal(resp)
		if got, err := newCodec().Marshal(resp); err != nil || !bytes.Equal(got.Materialize(), want) {
			t.Fatalf("with raw_body: codec %x, %v; protobuf %x", got.Materialize(), err, want)
		}
	})
}

// BenchmarkMarshal compares the codec's writing of an answer of three
// descriptors and two headers with protobuf's.
func BenchmarkMarshal(b *testing.B) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "RateLimit-Policy", Value: `"PerIP";q=100;w=60`}, {Key: "RateLimit", Value: `"PerIP";r=99;t=1`}}}
	for range 3 {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 99,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "PerIP", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
			DurationUntilReset: durationpb.New(600 * time.Millisecond)})
	}
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		c := newCodec()
		for b.Loop() {
			if _, err := c.Marshal(resp); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("protobuf", func(b *testing.B) {
		b.ReportAllocs()
		c := newCodec().CodecV2
		for b.Loop() {
			if _, err := c.Marshal(resp); err != nil {
				b.Fatal(err)
			}
		}
	})
}
