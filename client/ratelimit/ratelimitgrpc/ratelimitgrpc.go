// Package ratelimitgrpc puts ratelimitd in front of a gRPC server: its
// interceptors spend a rule's cost for each call (each stream, once, as
// it opens) through a ratelimit.Client, and refuse a denied call with
// RESOURCE_EXHAUSTED and a google.rpc.RetryInfo detail saying when to try
// again. It is a package of its own so that a service without gRPC does
// not build it.
package ratelimitgrpc

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/client/clientip"
	"github.com/ratelimitd/ratelimitd/client/internal/key"
	"github.com/ratelimitd/ratelimitd/client/ratelimit"
)

// Key names the bucket of an incoming call, from its context (peer,
// metadata) and its full method name ("/pkg.Service/Method"). An error
// refuses the call with INVALID_ARGUMENT.
type Key func(ctx context.Context, fullMethod string) (string, error)

// Rule says what the interceptors spend for each call.
type Rule struct {
	// Limit is the name of the limit spent on.
	Limit string
	// Key names each call's bucket of Limit: PeerAddress, Metadata,
	// Method, or a function of your own.
	Key Key
	// Cost is each call's cost; nil costs 1.
	Cost func(ctx context.Context, fullMethod string) int64
}

// UnaryServerInterceptor spends rule's cost for each unary call before
// its handler runs.
func UnaryServerInterceptor(c *ratelimit.Client, rule Rule) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := spend(ctx, c, rule, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor spends rule's cost once for each stream, as it
// opens.
func StreamServerInterceptor(c *ratelimit.Client, rule Rule) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := spend(ss.Context(), c, rule, info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// spend decides a call: nil when it may go on, else the status to refuse
// it with. No answer from ratelimitd is the Client's fail mode: open goes
// on, closed is UNAVAILABLE.
func spend(ctx context.Context, c *ratelimit.Client, rule Rule, method string) error {
	key, err := rule.Key(ctx, method)
	if err != nil {
		return status.Error(codes.InvalidArgument, "the call's rate-limit key: "+err.Error())
	}
	cost := int64(1)
	if rule.Cost != nil {
		cost = rule.Cost(ctx, method)
	}
	res, err := c.Spend(ctx, ratelimit.Bucket{Limit: rule.Limit, ID: key, Cost: cost})
	var p *ratelimit.Problem
	switch {
	case err == nil:
	case errors.Is(err, ratelimit.ErrUnavailable):
		return status.Error(codes.Unavailable, "the rate limiter is unavailable; retry later")
	case errors.As(err, &p) && p.BadBucketID():
		return status.Error(codes.InvalidArgument, "the call's rate-limit key is not a valid bucket id of "+rule.Limit)
	case errors.Is(err, context.Canceled):
		return status.FromContextError(err).Err()
	default:
		return status.Error(codes.Internal, "internal error")
	}
	if res.Allowed {
		return nil
	}
	st := status.New(codes.ResourceExhausted, "the rate limit "+rule.Limit+" is exhausted")
	// A call that can never succeed (a blocked bucket, a cost above the
	// burst) says no time: retrying would not help.
	if res.RetryAfter > 0 {
		if with, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(res.RetryAfter)}); err == nil {
			st = with
		}
	}
	return st.Err()
}

// PeerAddress keys calls by the client's address: the connecting peer,
// or, when the peer is a trusted proxy, the address its x-forwarded-for
// or x-real-ip metadata names, by the same rule as the HTTP middleware
// (package clientip).
func PeerAddress(trusted ...netip.Prefix) Key {
	res := clientip.New(trusted)
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", errors.New("the call has no peer address")
		}
		md, _ := metadata.FromIncomingContext(ctx)
		h := http.Header{}
		for _, name := range []string{clientip.HeaderForwardedFor, clientip.HeaderRealIP} {
			if v := md.Get(name); len(v) > 0 {
				h[name] = v
			}
		}
		a, err := res.From(p.Addr.String(), h)
		if err != nil {
			return "", err
		}
		return a.String(), nil
	}
}

// Metadata keys calls by the value of a metadata entry, such as an API
// key's; a call without it, with it more than once, or with a value that
// no limit could take as a bucket id (not UTF-8, holding NUL, longer than
// 128 KiB) is refused, by the same rule as ratelimit.Header.
func Metadata(name string) Key {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		return key.One(name, md.Get(name))
	}
}

// Method keys calls by their full method name, so that each method has a
// bucket of its own.
func Method(_ context.Context, fullMethod string) (string, error) { return fullMethod, nil }
