package rls

import (
	"errors"
	"fmt"

	extv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// codec is gRPC's protobuf codec, except that it decodes a
// ShouldRateLimit request by hand: without protobuf's reflection, which
// takes about a third longer (BenchmarkUnmarshal), and because Envoy copies header values into
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
