package tracing

import (
	"encoding/json"
	"testing"
	"time"
)

// otlpJSON is the part of an ExportTraceServiceRequest in the OTLP JSON
// encoding the tests read back (field names as the OTLP specification
// spells them; 64-bit integers as strings).
type otlpJSON struct {
	ResourceSpans []struct {
		Resource struct {
			Attributes []otlpAttr `json:"attributes"`
		} `json:"resource"`
		ScopeSpans []struct {
			Scope struct {
				Name    string `json:"name"`
				Version string `json:"version"`
			} `json:"scope"`
			Spans []otlpSpan `json:"spans"`
		} `json:"scopeSpans"`
	} `json:"resourceSpans"`
}

type otlpAttr struct {
	Key   string `json:"key"`
	Value struct {
		StringValue *string `json:"stringValue"`
		IntValue    *string `json:"intValue"`
		BoolValue   *bool   `json:"boolValue"`
	} `json:"value"`
}

type otlpSpan struct {
	TraceID      string     `json:"traceId"`
	SpanID       string     `json:"spanId"`
	ParentSpanID string     `json:"parentSpanId"`
	TraceState   string     `json:"traceState"`
	Name         string     `json:"name"`
	Kind         int        `json:"kind"`
	Start        string     `json:"startTimeUnixNano"`
	End          string     `json:"endTimeUnixNano"`
	Attributes   []otlpAttr `json:"attributes"`
	Events       []struct {
		Time string `json:"timeUnixNano"`
		Name string `json:"name"`
	} `json:"events"`
	Status *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"status"`
}

// The OTLP/HTTP JSON encoding's deviations from the protobuf JSON mapping:
// hex ids, integer enums, 64-bit integers as decimal strings; Edge spans
// and each node's spans under their own resource.
func TestAppendExport(t *testing.T) {
	t0 := time.Unix(1767225600, 0)
	tid := TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	root := SpanID{0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}
	child := SpanID{1, 2, 3, 4, 5, 6, 7, 8}
	spans := []Span{
		{TraceID: tid, SpanID: root, Name: "POST /v1/chat/completions", Kind: KindServer, Start: t0, End: t0.Add(250 * time.Millisecond),
			State: "congo=t61", Attrs: []Attr{String("gen_ai.request.model", "ti\"ny\xff"), Int("iop.retries", 1), Bool("iop.redispatched", true)},
			Events: []Event{{Name: "first_byte", Time: t0.Add(120 * time.Millisecond)}}},
		{TraceID: tid, SpanID: child, Parent: root, Name: "node run", Kind: KindServer, Start: t0, End: t0, Node: "gpu-1",
			Error: true, Message: "upstream_reset"},
	}
	b := AppendExport(nil, Resource{Version: "1.2.3"}, spans)
	if !json.Valid(b) {
		t.Fatalf("not JSON: %s", b)
	}
	var got otlpJSON
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.ResourceSpans) != 2 {
		t.Fatalf("%d resourceSpans, want 2 (edge, node): %s", len(got.ResourceSpans), b)
	}
	res := func(i int) map[string]string {
		m := map[string]string{}
		for _, a := range got.ResourceSpans[i].Resource.Attributes {
			m[a.Key] = *a.Value.StringValue
		}
		return m
	}
	if r := res(0); r["service.name"] != ServiceEdge || r["service.version"] != "1.2.3" {
		t.Errorf("edge resource %v", r)
	}
	if r := res(1); r["service.name"] != ServiceNode || r["service.instance.id"] != "gpu-1" {
		t.Errorf("node resource %v", r)
	}
	s := got.ResourceSpans[0].ScopeSpans[0].Spans[0]
	if s.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" || s.SpanID != "00f067aa0ba902b7" || s.ParentSpanID != "" {
		t.Errorf("ids %q %q %q, want lowercase hex and no parent", s.TraceID, s.SpanID, s.ParentSpanID)
	}
	if s.Kind != 2 || s.Start != "1767225600000000000" || s.End != "1767225600250000000" || s.TraceState != "congo=t61" {
		t.Errorf("span %+v", s)
	}
	if len(s.Attributes) != 3 || *s.Attributes[0].Value.StringValue != "ti\"ny\uFFFD" || *s.Attributes[1].Value.IntValue != "1" ||
		!*s.Attributes[2].Value.BoolValue {
		t.Errorf("attributes %s", b)
	}
	if len(s.Events) != 1 || s.Events[0].Time != "1767225600120000000" || s.Events[0].Name != "first_byte" {
		t.Errorf("events %+v", s.Events)
	}
	if s.Status != nil {
		t.Errorf("status %+v, want none (unset)", s.Status)
	}
	n := got.ResourceSpans[1].ScopeSpans[0].Spans[0]
	if n.ParentSpanID != "00f067aa0ba902b7" || n.Status == nil || n.Status.Code != 2 || n.Status.Message != "upstream_reset" {
		t.Errorf("node span %+v", n)
	}
	if sc := got.ResourceSpans[0].ScopeSpans[0].Scope; sc.Name != "iop" || sc.Version != "1.2.3" {
		t.Errorf("scope %+v", sc)
	}
}
