package main

import (
	"errors"
	"maps"
	"testing"
	"time"
)

// The measuring client's checks decide what counts as "no lost bytes": a
// stream is complete only with every expected content byte and its
// terminal event.
func TestCheckStream(t *testing.T) {
	sse := func(evs ...string) [][]byte {
		var out [][]byte
		for _, e := range evs {
			out = append(out, []byte(e))
		}
		return out
	}
	role := `{"choices":[{"delta":{"role":"assistant","content":null}}]}`
	tok := func(s string) string { return `{"choices":[{"delta":{"content":"` + s + `"}}]}` }
	fin := `{"choices":[{"finish_reason":"length","delta":{}}]}`
	line := func(s string, done bool) string {
		if done {
			return `{"message":{"role":"assistant","content":""},"done":true}`
		}
		return `{"message":{"role":"assistant","content":"` + s + `"},"done":false}`
	}
	tests := []struct {
		name   string
		format string
		events [][]byte
		want   string
		ok     bool
	}{
		{"sse complete", "sse", sse(role, tok(" lorem"), tok(" ipsum"), fin, "[DONE]"), " lorem ipsum", true},
		{"sse without [DONE]", "sse", sse(role, tok(" lorem"), tok(" ipsum"), fin), " lorem ipsum", false},
		{"sse a token lost", "sse", sse(role, tok(" lorem"), fin, "[DONE]"), " lorem ipsum", false},
		{"sse error event", "sse", sse(`{"error":{"message":"x"}}`, "[DONE]"), "", false},
		{"sse event after [DONE]", "sse", sse(tok(" lorem"), "[DONE]", tok(" ipsum")), " lorem", false},
		{"sse not JSON", "sse", sse("{", "[DONE]"), "", false},
		{"ndjson complete", "ndjson", sse(line(" lorem", false), line(" ipsum", false), line("", true)), " lorem ipsum", true},
		{"ndjson without done", "ndjson", sse(line(" lorem", false), line(" ipsum", false)), " lorem ipsum", false},
		{"ndjson error line", "ndjson", sse(`{"error":"boom"}`), "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkStream(tc.events, streamSpec{format: tc.format, want: tc.want})
			if (err == nil) != tc.ok {
				t.Fatalf("checkStream = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrStream) {
				t.Fatalf("error %v is not ErrStream", err)
			}
		})
	}
}

func TestExpectedLoop(t *testing.T) {
	tests := []struct {
		n    int
		want string
	}{
		{0, ""},
		{1, " lorem"},
		{6, " lorem ipsum dolor sit amet, lorem"},
	}
	for _, tc := range tests {
		if got := expectedLoop(tc.n); got != tc.want {
			t.Errorf("expectedLoop(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
	if got := len(expectedLoop(15)); got != 84 {
		t.Errorf("15 tokens are %d bytes, want 84", got)
	}
}

func TestQuantile(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	sortDurations(d)
	tests := []struct {
		q    float64
		want time.Duration
	}{
		{0.50, 50 * time.Millisecond},
		{0.90, 90 * time.Millisecond},
		{0.99, 99 * time.Millisecond},
		{1, 100 * time.Millisecond},
		{0, time.Millisecond},
	}
	for _, tc := range tests {
		if got := quantile(d, tc.q); got != tc.want {
			t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := quantile(nil, 0.5); got != 0 {
		t.Errorf("quantile of nothing = %v, want 0", got)
	}
}

func TestParsePids(t *testing.T) {
	tests := []struct {
		in   string
		want map[string]int
		ok   bool
	}{
		{"edge=12,node=34", map[string]int{"edge": 12, "node": 34}, true},
		{"", map[string]int{}, true},
		{"edge=12,", map[string]int{"edge": 12}, true},
		{"edge", nil, false},
		{"edge=x", nil, false},
		{"edge=0", nil, false},
	}
	for _, tc := range tests {
		got, err := parsePids(tc.in)
		if (err == nil) != tc.ok || (tc.ok && !maps.Equal(got, tc.want)) {
			t.Errorf("parsePids(%q) = %v, %v; want %v, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestParseWrk(t *testing.T) {
	const clean = `Running 5s test @ http://127.0.0.1:28434/v1/chat/completions
  2 threads and 64 connections
  125520 requests in 5.02s, 140.07MB read
Requests/sec:  25026.34
Transfer/sec:     27.90MB
`
	const failing = `  9720 requests in 3.00s, 4.1MB read
  Socket errors: connect 0, read 3, write 0, timeout 2
  Non-2xx or 3xx responses: 7
Requests/sec:   3209.82
`
	tests := []struct {
		name     string
		out      string
		rps      float64
		total    int
		failures map[string]int
		ok       bool
	}{
		{"clean", clean, 25026.34, 125520, map[string]int{}, true},
		{"failures", failing, 3209.82, 9720, map[string]int{"read": 3, "timeout": 2, "non_2xx": 7}, true},
		{"garbage", "unable to connect", 0, 0, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rps, total, f, err := parseWrk(tc.out)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if !tc.ok {
				if !errors.Is(err, ErrWrkOutput) {
					t.Fatalf("err %v is not ErrWrkOutput", err)
				}
				return
			}
			if rps != tc.rps || total != tc.total || !maps.Equal(f, tc.failures) {
				t.Fatalf("got %v %v %v, want %v %v %v", rps, total, f, tc.rps, tc.total, tc.failures)
			}
		})
	}
}
