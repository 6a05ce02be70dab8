package rls

import (
	"errors"
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// codec is gRPC's protobuf codec, except that it decodes a
// ShouldRateLimit request and encodes its answer by hand, without
// protobuf's reflection, which takes longer (BenchmarkUnmarshal,
// BenchmarkMarshal). The request is also read by hand because Envoy
// copies header values into
// descriptors byte for byte: protobuf refuses strings that are not UTF-8,
// which gRPC would answer with INTERNAL, while read, the request is
// refused with an INVALID_ARGUMENT naming the descriptor and entry, as
// other bad input is.
type codec struct {
	encoding.CodecV2
}

func newCodec() codec { return codec{encoding.GetCodecV2(proto.Name)} }

// Unmarshal decodes a RateLimitRequest by hand and any other message as
// protobuf does. The strings of the request are copies: gRPC reuses data
// once this returns.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	var buf []byte
	if len(data) == 1 {
		buf = data[0].ReadOnlyData()
	} else {
		buf = data.Materialize()
	}
	req.Reset()
	return decodeRequest(buf, req)
}

// Marshal encodes a RateLimitResponse by hand, as protobuf would, when it
// holds only the fields ShouldRateLimit sets; any other message, or an
// answer with other fields, as protobuf does.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	resp, ok := v.(*rlsv3.RateLimitResponse)
	if !ok || !handWritten(resp) {
		return c.CodecV2.Marshal(v)
	}
	b := appendResponse(make([]byte, 0, responseSize(resp)), resp)
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

// handWritten reports whether appendResponse writes every field of resp.
func handWritten(resp *rlsv3.RateLimitResponse) bool {
	if resp.RequestHeadersToAdd != nil || resp.RawBody != nil || resp.DynamicMetadata != nil || resp.Quota != nil {
		return false
	}
	for _, st := range resp.Statuses {
		if st == nil || st.Quota != nil || st.CurrentLimit != nil && st.CurrentLimit.UnitMultiplier != nil {
			return false
		}
	}
	for _, h := range resp.ResponseHeadersToAdd {
		if h == nil || h.RawValue != nil {
			return false
		}
	}
	return true
}

// The field numbers of the messages appendResponse writes.
const (
	responseOverallCode = 1
	responseStatuses    = 2
	responseHeaders     = 3
	statusCode          = 1
	statusCurrentLimit  = 2
	statusRemaining     = 3
	statusUntilReset    = 4
	limitPerUnit        = 1
	limitUnit           = 2
	limitName           = 3
	durationSeconds     = 1
	durationNanos       = 2
	headerKey           = 1
	headerValue         = 2
)

// Each field takes a tag of one byte: every number above is below 16.

func varintField(n uint64) int {
	if n == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(n)
}

func bytesField(n int) int { return 1 + protowire.SizeBytes(n) }

func stringField(s string) int {
	if s == "" {
		return 0
	}
	return bytesField(len(s))
}

func appendVarintField(b []byte, num protowire.Number, n uint64) []byte {
	if n == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), n)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func appendMessageHeader(b []byte, num protowire.Number, size int) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.BytesType), uint64(size))
}

func responseSize(r *rlsv3.RateLimitResponse) int {
	n := varintField(uint64(r.OverallCode))
	for _, st := range r.Statuses {
		n += bytesField(statusSize(st))
	}
	for _, h := range r.ResponseHeadersToAdd {
		n += bytesField(headerSize(h))
	}
	return n
}

func statusSize(st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := varintField(uint64(st.Code)) + varintField(uint64(st.LimitRemaining))
	if st.CurrentLimit != nil {
		n += bytesField(limitSize(st.CurrentLimit))
	}
	if st.DurationUntilReset != nil {
		n += bytesField(durationSize(st.DurationUntilReset.Seconds, st.DurationUntilReset.Nanos))
	}
	return n
}

func limitSize(l *rlsv3.RateLimitResponse_RateLimit) int {
	return varintField(uint64(l.RequestsPerUnit)) + varintField(uint64(l.Unit)) + stringField(l.Name)
}

// durationSize takes the fields of a Duration: negative numbers are
// written as protobuf writes them, in ten bytes.
func durationSize(seconds int64, nanos int32) int {
	return varintField(uint64(seconds)) + varintField(uint64(int64(nanos)))
}

func headerSize(h *corev3.HeaderValue) int { return stringField(h.Key) + stringField(h.Value) }

// appendResponse writes r in protobuf's encoding, fields in the order of
// their numbers, as protobuf writes them.
func appendResponse(b []byte, r *rlsv3.RateLimitResponse) []byte {
	b = appendVarintField(b, responseOverallCode, uint64(r.OverallCode))
	for _, st := range r.Statuses {
		b = appendMessageHeader(b, responseStatuses, statusSize(st))
		b = appendVarintField(b, statusCode, uint64(st.Code))
		if l := st.CurrentLimit; l != nil {
			b = appendMessageHeader(b, statusCurrentLimit, limitSize(l))
			b = appendVarintField(b, limitPerUnit, uint64(l.RequestsPerUnit))
			b = appendVarintField(b, limitUnit, uint64(l.Unit))
			b = appendStringField(b, limitName, l.Name)
		}
		b = appendVarintField(b, statusRemaining, uint64(st.LimitRemaining))
		if d := st.DurationUntilReset; d != nil {
			b = appendMessageHeader(b, statusUntilReset, durationSize(d.Seconds, d.Nanos))
			b = appendVarintField(b, durationSeconds, uint64(d.Seconds))
			b = appendVarintField(b, durationNanos, uint64(int64(d.Nanos)))
		}
	}
	for _, h := range r.ResponseHeadersToAdd {
		b = appendMessageHeader(b, responseHeaders, headerSize(h))
		b = appendStringField(b, headerKey, h.Key)
		b = appendStringField(b, headerValue, h.Value)
	}
	return b
}

// The field numbers of the messages decodeRequest reads.
const (
	requestDomain        = 1
	requestDescriptors   = 2
	requestHitsAddend    = 3
	descriptorEntries    = 1
	descriptorHitsAddend = 3
	descriptorNegative   = 4
	entryKey             = 1
	entryValue           = 2
	wrapperValue         = 1
)

var errWire = errors.New("malformed protobuf")

// decodeRequest reads the fields of a RateLimitRequest that ShouldRateLimit
// uses, keeping strings as their bytes are; others are skipped.
func decodeRequest(b []byte, req *rlsv3.RateLimitRequest) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		switch {
		case num == requestDomain && typ == protowire.BytesType:
			req.Domain = string(v)
		case num == requestHitsAddend && typ == protowire.VarintType:
			req.HitsAddend = uint32(n)
		case num == requestDescriptors && typ == protowire.BytesType:
			d := &extv3.RateLimitDescriptor{}
			if err := decodeDescriptor(v, d); err != nil {
				return err
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		return nil
	})
}

func decodeDescriptor(b []byte, d *extv3.RateLimitDescriptor) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		switch {
		case num == descriptorEntries && typ == protowire.BytesType:
			e := &extv3.RateLimitDescriptor_Entry{}
			err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				switch {
				case num == entryKey && typ == protowire.BytesType:
					e.Key = string(v)
				case num == entryValue && typ == protowire.BytesType:
					e.Value = string(v)
				}
				return nil
			})
			if err != nil {
				return err
			}
			d.Entries = append(d.Entries, e)
		case num == descriptorHitsAddend && typ == protowire.BytesType:
			// A message field given twice is merged, as protobuf does.
			w := d.HitsAddend
			if w == nil {
				w = &wrapperspb.UInt64Value{}
			}
			err := eachField(v, func(num protowire.Number, typ protowire.Type, _ []byte, n uint64) error {
				if num == wrapperValue && typ == protowire.VarintType {
					w.Value = n
				}
				return nil
			})
			if err != nil {
				return err
			}
			d.HitsAddend = w
		case num == descriptorNegative && typ == protowire.VarintType:
			d.IsNegativeHits = n != 0
		}
		return nil
	})
}

// eachField calls fn with every field of a message: its bytes for a
// length-delimited field, its number for a varint.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error) error {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return fmt.Errorf("%w: %w", errWire, protowire.ParseError(l))
		}
		b = b[l:]
		var v []byte
		var n uint64
		switch typ {
		case protowire.BytesType:
			v, l = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			n, l = protowire.ConsumeVarint(b)
		default:
			l = protowire.ConsumeFieldValue(num, typ, b)
		}
		if l < 0 {
			return fmt.Errorf("%w: %w", errWire, protowire.ParseError(l))
		}
		b = b[l:]
		if err := fn(num, typ, v, n); err != nil {
			return err
		}
	}
	return nil
}
