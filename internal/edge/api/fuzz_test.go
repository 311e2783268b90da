package api

import (
	"bytes"
	"encoding/json"
	"io"
	"iop/internal/edge/reply"
	"net/http"
	"net/http/httptest"
	"testing"

	"iop/internal/edge/limit"
	"iop/internal/edge/routing"
)

// FuzzParseHead: a client body of any endpoint never panics parseHead, and
// whatever it accepts encoding/json reads the same way: a JSON object whose
// "model" is that non-empty string, "stream" that boolean, and the
// endpoint's required field an array (B1: every request body of each
// surface is fuzzed). The routing prefix scan of an accepted body never
// panics and stays within maxPrefixBoundaries.
func FuzzParseHead(f *testing.F) {
	for _, s := range []string{chatBody, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`,
		`{"model":"m","input":"hi"}`, `{"model":"m","messages":{}}`, `{"model":"","messages":[]}`, `{"stream":null,"model":"x"}`,
		`{"model":"a","model":"b","messages":[1]}`, `{"model":"m","system":"s","messages":[{"role":"system","content":"x"},{"role":"user"},2]}`,
		`{"model":"m","instructions":"i","input":[{"role":"developer"},"x"],"tools":[]}`, `{"model":"m","input":"hi","previous_response_id":"r"}`, "{\"model\":\"\\ud800\",\"messages\":[]}", `[{"model":"m"}]`, `{`} {
		for ep := range 6 {
			f.Add([]byte(s), uint8(ep))
		}
	}
	hasher := routing.NewHasher()
	eps := [...]*endpoint{&epChat, &epResponses, &epMessages, &epCountTokens, &epCompletions, &epEmbeddings}
	f.Fuzz(func(t *testing.T, body []byte, which uint8) {
		ep := eps[int(which)%len(eps)]
		var hd head
		if e := parseHead(body, ep, &hd); e != nil {
			if e.Status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", e.Status)
			}
			return
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("accepted what encoding/json rejects (%v): %q", err, body)
		}
		var model string
		if json.Unmarshal(m["model"], &model) != nil || model != hd.model || model == "" {
			t.Fatalf("model: got %q, encoding/json says %s", hd.model, m["model"])
		}
		var stream *bool
		if raw, ok := m["stream"]; ok && json.Unmarshal(raw, &stream) != nil {
			t.Fatalf("accepted stream %s", raw)
		}
		if (stream != nil && *stream) != hd.stream {
			t.Fatalf("stream: got %v, encoding/json says %s", hd.stream, m["stream"])
		}
		if ep.field != "" {
			var arr []json.RawMessage
			if json.Unmarshal(m[ep.field], &arr) != nil || arr == nil {
				t.Fatalf("accepted %q = %s", ep.field, m[ep.field])
			}
		}
		for _, sp := range hd.modelSpans {
			if sp.Start < 0 || sp.End > len(body) || !sp.OK() {
				t.Fatalf("model span %v outside the body of %d bytes", sp, len(body))
			}
		}
		// The conversation prefix of prefix-affinity routing scans the same
		// body: it must stay within its bound.
		if keys := prefixOf(hasher, body, ep, hd.model, nil); len(keys) > maxPrefixBoundaries {
			t.Fatalf("%d prefix boundaries, over %d", len(keys), maxPrefixBoundaries)
		}
	})
}

// FuzzReadBody: any body, declared or chunked, cut into any reads, under
// any cap: readBody returns exactly the bytes sent when they fit, refuses
// with 413/400 when they do not, never holds a buffer past what the
// declaration and twice the bytes received allow, and gives every reserved
// byte back on failure (B1).
func FuzzReadBody(f *testing.F) {
	f.Add([]byte(chatBody), int16(-1), uint16(100), uint8(3))
	f.Add(bytes.Repeat([]byte("x"), 9000), int16(9000), uint16(9000), uint8(0))
	f.Add(bytes.Repeat([]byte("x"), 9000), int16(8999), uint16(10000), uint8(1))
	f.Add([]byte("{"), int16(3000), uint16(5000), uint8(7))
	f.Fuzz(func(t *testing.T, data []byte, declared int16, maxBody uint16, step uint8) {
		capBytes := int64(maxBody) + 1
		var rd io.Reader = bytes.NewReader(data)
		if step > 0 { // reads of step bytes, at most 64 of them per body
			rd = &stepReader{data: data, step: max(int(step), len(data)/64+1)}
		}
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", io.NopCloser(rd))
		r.ContentLength = int64(declared)
		if declared < 0 {
			r.ContentLength = -1
		}
		var budget limit.Budget
		got, err := readBody(httptest.NewRecorder(), r, capBytes, &budget)
		sent := int64(len(data))
		cl := r.ContentLength
		switch {
		case cl > capBytes, cl < 0 && sent > capBytes:
			if e, ok := err.(*reply.Error); !ok || e.Status != http.StatusRequestEntityTooLarge {
				t.Fatalf("got %v, want 413", err)
			}
		case cl > sent:
			if e, ok := err.(*reply.Error); !ok || e.Status != http.StatusBadRequest {
				t.Fatalf("got %v, want 400", err)
			}
		case err != nil:
			t.Fatalf("declared %d, sent %d, cap %d: %v", cl, sent, capBytes, err)
		default:
			want := data
			if cl >= 0 {
				want = data[:cl]
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("got %d bytes, want %d", len(got), len(want))
			}
			if cl > 0 && int64(cap(got)) > cl {
				t.Fatalf("buffer of %d bytes for a declared %d", cap(got), cl)
			}
			if cap(got) > 2*len(got)+bodyFirstBuffer {
				t.Fatalf("buffer of %d bytes for %d received", cap(got), len(got))
			}
			if budget.Used() != int64(cap(got)) {
				t.Fatalf("budget holds %d bytes, want cap(body) = %d", budget.Used(), cap(got))
			}
			return
		}
		if budget.Used() != 0 {
			t.Fatalf("a failed read left %d bytes reserved", budget.Used())
		}
	})
}

// stepReader returns data at most step bytes per Read.
type stepReader struct {
	data []byte
	step int
}

func (s *stepReader) Read(p []byte) (int, error) {
	if len(s.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), s.step)], s.data)
	s.data = s.data[n:]
	return n, nil
}
