package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/stats"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// tracerName names the instrumentation in every span: this module.
const tracerName = "github.com/ratelimitd/ratelimitd"

// Traces are the hooks through which each layer traces its work. The
// zero Traces, tracing off, has every hook nil, and a layer given a nil
// hook runs exactly as it does without one. No span carries a bucket id,
// a raw path or a token: requests are named by their route pattern, store
// calls by the names of their limits.
type Traces struct {
	// HTTP starts the server span of a request, continuing the trace of
	// the request's traceparent header; it returns the request carrying
	// the span and what ends the span with the route's pattern ("" when
	// none matched), which names it, and the answer's status. It is
	// edge.Config.Trace.
	HTTP func(r *http.Request) (*http.Request, func(route string, status int))
	// Store starts the span of a decision's call to the store, a child of
	// the request's; it is limiter.Config.TraceStore.
	Store func(ctx context.Context, op limiter.Op, limits []string) (context.Context, func(allowed bool, err error))
	// GRPC traces every gRPC call but health checks, continuing the trace
	// of the call's traceparent metadata; it is rls.Config.StatsHandler.
	GRPC stats.Handler
}

// TracesFromEnv returns the traces the standard OpenTelemetry variables
// ask for, and what flushes the spans not yet exported and stops the
// exporter. Tracing is on when OTEL_TRACES_EXPORTER names an exporter
// other than none (otlp or console) and OTEL_SDK_DISABLED is not true;
// otherwise the Traces are the zero Traces and stop does nothing. The
// exporter reads OTEL_EXPORTER_OTLP_* and the SDK OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_*, from
// the process's environment, which getenv is in production; an exporter
// or protocol they do not know is an error, so that a typo does not
// silently lose every span.
func TracesFromEnv(ctx context.Context, getenv func(string) string, version string) (Traces, func(context.Context) error, error) {
	exporter := getenv("OTEL_TRACES_EXPORTER")
	if exporter == "" || exporter == "none" || strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return Traces{}, func(context.Context) error { return nil }, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		protocol := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if protocol == "" {
			protocol = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		return Traces{}, nil, fmt.Errorf("traces (OTEL_TRACES_EXPORTER=%q, OTEL_EXPORTER_OTLP_PROTOCOL=%q): %w", exporter, protocol, err)
	}
	// Later sources win: the variables name the service over the default.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "ratelimitd"), attribute.String("service.version", version)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		_ = exp.Shutdown(ctx)
		return Traces{}, nil, fmt.Errorf("traces (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return NewTraces(tp, version), tp.Shutdown, nil
}

// NewTraces returns hooks that trace through tp, which decides what is
// sampled and where spans go. Traces propagate as W3C Trace Context only.
func NewTraces(tp trace.TracerProvider, version string) Traces {
	t := tracer{tracer: tp.Tracer(tracerName, trace.WithInstrumentationVersion(version))}
	return Traces{
		HTTP:  t.request,
		Store: t.store,
		GRPC: otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(tp),
			otelgrpc.WithPropagators(propagation.TraceContext{}),
			// Metrics are Prometheus's job here; a probe's health check
			// every second would bury the calls worth reading.
			otelgrpc.WithMeterProvider(noop.NewMeterProvider()),
			otelgrpc.WithFilter(filters.Not(filters.HealthCheck())),
		),
	}
}

// tracer makes the spans of the HTTP fronts and of the store calls.
type tracer struct {
	tracer trace.Tracer
	prop   propagation.TraceContext
}

// request starts a server span, named "METHOD route" once the route is
// known, as OpenTelemetry's HTTP conventions name it: the edge knows it
// only after a router has matched. The path is never recorded: an admin
// path may hold a bucket id.
func (t tracer) request(r *http.Request) (*http.Request, func(string, int)) {
	ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	method := methodLabels[methodOf(r.Method)]
	if method == "other" {
		method = "_OTHER"
	}
	ctx, span := t.tracer.Start(ctx, method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", method)))
	return r.WithContext(ctx), func(route string, status int) {
		if route != "" {
			span.SetName(method + " " + route)
			span.SetAttributes(attribute.String("http.route", route))
		}
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		// A 4xx is the client's mistake, not the server's.
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
		span.End()
	}
}

// store starts the span of a store call: "store spend", with the
// operation, the limits' names and, at its end, the result: allowed,
// denied (a bucket outside shadow limits denied its cost) or error.
func (t tracer) store(ctx context.Context, op limiter.Op, limits []string) (context.Context, func(bool, error)) {
	ctx, span := t.tracer.Start(ctx, "store "+op.String(), trace.WithAttributes(
		attribute.String("ratelimitd.op", op.String()),
		attribute.StringSlice("ratelimitd.limits", limits),
	))
	return ctx, func(allowed bool, err error) {
		result := "allowed"
		switch {
		case err != nil:
			// Store errors name the store's trouble, never a key.
			result = "error"
			span.SetStatus(codes.Error, err.Error())
		case !allowed:
			result = "denied"
		}
		span.SetAttributes(attribute.String("ratelimitd.result", result))
		span.End()
	}
}
