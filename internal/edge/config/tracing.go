package config

import (
	"net/url"
	"strings"
)

// Tracing defaults and bounds (docs/operating.md "Tracing").
const (
	DefaultTraceTimeoutMs = 5000  // tracing.timeout_ms
	MaxTraceTimeoutMs     = 60000 // a minute
	DefaultTraceQueue     = 2048  // tracing.queue_spans
	MinTraceQueue         = 16
	MaxTraceQueue         = 1 << 16
)

// Tracing configures OpenTelemetry traces: spans of every sampled request
// (the Edge's and its node's), sent over OTLP/HTTP with the JSON encoding
// to a collector. Off unless OTLPEndpoint is set. Read at start: a reload
// that changes it is logged and takes effect after a restart.
type Tracing struct {
	// OTLPEndpoint is the collector's base URL (http or https, no user
	// info, query or fragment), e.g. "http://127.0.0.1:4318": spans are
	// POSTed to {endpoint}/v1/traces (a URL already ending in /v1/traces is
	// used as it is). "" = tracing off: no span, no trace context sent.
	OTLPEndpoint string `json:"otlp_endpoint"`
	// SamplingRatio is the share of new traces sampled, 0 to 1; omitted =
	// 1. A request whose client sent a valid traceparent follows its
	// sampled flag instead (parent-based).
	SamplingRatio *float64 `json:"sampling_ratio"`
	// TimeoutMs bounds one export request, connect included; 0 = 5000.
	TimeoutMs int64 `json:"timeout_ms"`
	// QueueSpans bounds the spans waiting for export; beyond it they are
	// dropped and counted. 0 = 2048.
	QueueSpans int `json:"queue_spans"`
}

// Enabled reports whether traces are exported.
func (t Tracing) Enabled() bool { return t.OTLPEndpoint != "" }

// Ratio is tracing.sampling_ratio in effect.
func (t Tracing) Ratio() float64 {
	if t.SamplingRatio == nil {
		return 1
	}
	return *t.SamplingRatio
}

func (c *Config) tracingDefaults() {
	t := &c.Tracing
	if t.TimeoutMs == 0 {
		t.TimeoutMs = DefaultTraceTimeoutMs
	}
	if t.QueueSpans == 0 {
		t.QueueSpans = DefaultTraceQueue
	}
}

// validateTracing checks the tracing block.
func (c *Config) validateTracing(add func(string, string, ...any)) {
	t := c.Tracing
	if t.OTLPEndpoint != "" {
		u, err := url.Parse(t.OTLPEndpoint)
		switch {
		case err != nil || u.Host == "" || u.Scheme != "http" && u.Scheme != "https":
			add("tracing.otlp_endpoint", "want an http:// or https:// URL with a host, e.g. http://127.0.0.1:4318")
		case u.User != nil:
			add("tracing.otlp_endpoint", "must not carry user info (a credential in a URL ends up in logs)")
		case u.RawQuery != "" || u.Fragment != "" || strings.Contains(t.OTLPEndpoint, "?"):
			add("tracing.otlp_endpoint", "must not have a query or a fragment")
		}
	}
	if r := t.SamplingRatio; r != nil && !(*r >= 0 && *r <= 1) {
		add("tracing.sampling_ratio", "must be between 0 and 1, got %v", *r)
	}
	if t.TimeoutMs < 1 || t.TimeoutMs > MaxTraceTimeoutMs {
		add("tracing.timeout_ms", "must be between 1 and %d, got %d", MaxTraceTimeoutMs, t.TimeoutMs)
	}
	if t.QueueSpans < MinTraceQueue || t.QueueSpans > MaxTraceQueue {
		add("tracing.queue_spans", "must be between %d and %d, got %d", MinTraceQueue, MaxTraceQueue, t.QueueSpans)
	}
}
