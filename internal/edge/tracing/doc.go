// Package tracing owns the Edge's OpenTelemetry traces (docs/operating.md
// "Tracing"): the W3C trace context a client sends (traceparent and
// tracestate, W3C Trace Context Level 1 and 2) and the sampling decision
// for a new trace (Sample), the span values the HTTP layer builds from what
// it already measures (Span), the checks and clamps applied to the spans a
// node relays on a terminal (NodeSpans), their OTLP/HTTP JSON encoding
// (AppendExport) and the bounded exporter that sends them to a collector
// off the request path (Exporter).
//
// It uses the standard library only: the encoding is written with appends,
// checked against the OpenTelemetry collector's own OTLP JSON decoder in
// the end-to-end suite's module (internal/e2e/sdk, TestTracingOTLP).
//
// It must never: block or slow a request (Export appends under a mutex or
// drops, and the one goroutine, Run, does the I/O, each request bounded by
// a timeout), hold more than Options.QueueSpans spans, log per span, or put
// a body, a key, a credential or an upstream address in a span (SPEC P4:
// the HTTP layer hands it names, codes and numbers it already logs; a
// node's spans are reduced to typed fields with bounded strings).
package tracing
