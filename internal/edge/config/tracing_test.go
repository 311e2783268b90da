package config

import (
	"strings"
	"testing"
)

// The tracing block: off by default, its defaults, and every bad value
// named by its path (docs/config.md).
func TestTracingConfig(t *testing.T) {
	with := func(block string) string {
		return strings.Replace(valid, `"models"`, `"tracing": `+block+`, "models"`, 1)
	}
	c := mustParse(t, valid)
	if tr := c.Tracing; tr.Enabled() || tr.Ratio() != 1 || tr.TimeoutMs != DefaultTraceTimeoutMs || tr.QueueSpans != DefaultTraceQueue {
		t.Fatalf("defaults: %+v", tr)
	}
	c = mustParse(t, with(`{"otlp_endpoint": "http://127.0.0.1:4318", "sampling_ratio": 0}`))
	if tr := c.Tracing; !tr.Enabled() || tr.Ratio() != 0 {
		t.Fatalf("explicit ratio 0: %+v", tr)
	}
	rows := []struct{ block, want string }{
		{`{"otlp_endpoint": "127.0.0.1:4318"}`, "tracing.otlp_endpoint: want an http:// or https:// URL"},
		{`{"otlp_endpoint": "ftp://c:4318"}`, "tracing.otlp_endpoint: want an http:// or https:// URL"},
		{`{"otlp_endpoint": "http://u:p@c:4318"}`, "tracing.otlp_endpoint: must not carry user info"},
		{`{"otlp_endpoint": "http://c:4318/?a=b"}`, "tracing.otlp_endpoint: must not have a query"},
		{`{"sampling_ratio": 1.5}`, "tracing.sampling_ratio: must be between 0 and 1, got 1.5"},
		{`{"sampling_ratio": -0.1}`, "tracing.sampling_ratio: must be between 0 and 1"},
		{`{"timeout_ms": -1}`, "tracing.timeout_ms: must be between 1 and 60000, got -1"},
		{`{"queue_spans": 8}`, "tracing.queue_spans: must be between 16 and 65536, got 8"},
		{`{"endpoint": "http://c"}`, "tracing.endpoint: unknown field"},
	}
	for _, row := range rows {
		_, err := Parse([]byte(with(row.block)))
		if err == nil || !strings.Contains(err.Error(), row.want) {
			t.Errorf("%s: got %v, want %q", row.block, err, row.want)
		}
	}
}
