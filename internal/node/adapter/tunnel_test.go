package adapter_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// T2: a tunnel relays the captured answers byte for byte and observes their
// usage beside them.
func TestTunnelRelaySamples(t *testing.T) {
	cases := []struct {
		file, ctype, op string
		usage           []int64 // prompt, completion, total; nil = no USAGE frame
	}{
		{"llama_v1_chat_stream.sse", "text/event-stream", protocol.OpChatCompletions, []int64{55, 8, 63}},
		{"ollama_v1_chat_stream.sse", "text/event-stream", protocol.OpChatCompletions, []int64{21, 8, 29}},
		{"llama_v1_chat_tool_stream.sse", "text/event-stream", protocol.OpChatCompletions, []int64{531, 4, 535}},
		{"llama_v1_messages_stream.sse", "text/event-stream", protocol.OpMessages, []int64{55, 8, 63}},
		{"ollama_v1_messages_stream.sse", "text/event-stream", protocol.OpMessages, []int64{21, 8, 29}},
		{"llama_v1_chat_nonstream.json", "application/json; charset=utf-8", protocol.OpChatCompletions, []int64{55, 8, 63}},
		{"ollama_v1_chat_loop_nonstream.json", "application/json", protocol.OpChatCompletions, []int64{21, 6, 27}},
		{"llama_v1_models.json", "application/json", protocol.OpModels, nil},
		{"ollama_api_chat_stream.ndjson", "application/x-ndjson", "", []int64{21, 8, 29}},
	}
	for _, tc := range cases {
		t.Run("T2 "+tc.file, func(t *testing.T) {
			leakcheck.Check(t)
			want := sample(t, tc.file)
			up := newFake(t, replay(200, tc.ctype, want))
			s := newSet(t, adapter.Options{}, compatAdapter("llama", llamaProfile(up.URL), 1))
			req := &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny", Operation: tc.op, Method: "POST", Body: []byte(`{"model":"tiny"}`), Stream: true}
			if tc.op == "" {
				req.Path = "/api/chat"
			}
			if tc.op == protocol.OpModels {
				req.Method, req.Body = "GET", nil
			}
			last, status, body, usages := checkTunnel(t, tunnelAll(context.Background(), s, req))
			if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END || status != 200 {
				t.Fatalf("got %v %q status %d, want END after 200", last.GetKind(), last.GetError(), status)
			}
			if !bytes.Equal(body, want) {
				t.Fatalf("T2: relayed body differs from the upstream's:\n%q\nwant\n%q", body, want)
			}
			if tc.usage == nil {
				if len(usages) != 0 {
					t.Fatalf("T2: USAGE frames %v, want none", usages)
				}
			} else {
				if len(usages) != 1 {
					t.Fatalf("T2: %d USAGE frames, want 1", len(usages))
				}
				u := usages[0]
				if got := []int64{u.GetPromptTokens(), u.GetCompletionTokens(), u.GetTotalTokens()}; got[0] != tc.usage[0] || got[1] != tc.usage[1] || got[2] != tc.usage[2] {
					t.Fatalf("T2: usage %v, want %v", got, tc.usage)
				}
			}
			if last.GetAdapter() != "llama" || last.GetTarget() != "tiny" {
				t.Fatalf("H8: terminal adapter/target %q/%q", last.GetAdapter(), last.GetTarget())
			}
		})
	}
}

// T2: an upstream 4xx/5xx is relayed as the provider said it; resets and
// large bodies keep the frame grammar.
func TestTunnelStatusesAndFailures(t *testing.T) {
	s404, b404 := httpSample(t, "ollama_v1_chat_error_unknown_model.http")
	s500, b500 := httpSample(t, "llama_error_bad_json.http")
	big := bytes.Repeat([]byte("0123456789abcdef"), 100<<10/16) // 100 KiB
	stream := sample(t, "llama_v1_chat_stream.sse")
	cases := []struct {
		name   string
		h      func(http.ResponseWriter, *http.Request, []byte)
		kind   iop.TunnelFrameKind
		code   string
		status int32
		body   []byte
	}{
		{"T2 404 relayed with its body then END", replay(s404, "application/json", b404), iop.TunnelFrameKind_TUNNEL_FRAME_END, "", 404, b404},
		{"T2 500 with JSON body relayed then END", replay(s500, "application/json", b500), iop.TunnelFrameKind_TUNNEL_FRAME_END, "", 500, b500},
		{"T2 reset mid-stream: ERROR after the BODY frames sent", resetAfter("text/event-stream", stream[:300], stream[300:900]),
			iop.TunnelFrameKind_TUNNEL_FRAME_ERROR, protocol.CodeUpstreamError.String(), 200, stream[:900]},
		{"T2 100 KiB body in frames of at most 32 KiB", func(w http.ResponseWriter, r *http.Request, _ []byte) {
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(big)
		}, iop.TunnelFrameKind_TUNNEL_FRAME_END, "", 200, big},
		{"T2 empty body", replay(204, "", nil), iop.TunnelFrameKind_TUNNEL_FRAME_END, "", 204, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			up := newFake(t, tc.h)
			s := newSet(t, adapter.Options{}, compatAdapter("llama", llamaProfile(up.URL), 1))
			frs := tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny", Operation: protocol.OpChatCompletions, Body: []byte(`{}`)})
			last, status, body, usages := checkTunnel(t, frs)
			if last.GetKind() != tc.kind || last.GetFailureCode() != tc.code || status != tc.status {
				t.Fatalf("got %v %q (%q) status %d, want %v %q status %d", last.GetKind(), last.GetFailureCode(), last.GetError(), status, tc.kind, tc.code, tc.status)
			}
			if !bytes.Equal(body, tc.body) {
				t.Fatalf("T2: relayed %d bytes, want the upstream's %d", len(body), len(tc.body))
			}
			if tc.status >= 400 && len(usages) != 0 {
				t.Fatalf("T2: USAGE on an error status")
			}
		})
	}
}

// T2: BODY frames are sent as read: the fake sends its second chunk only
// after the tunnel emitted the first.
func TestTunnelStreamsAsRead(t *testing.T) {
	leakcheck.Check(t)
	first := make(chan struct{})
	up := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		_, _ = w.Write([]byte("data: one\n\n"))
		_ = rc.Flush()
		select {
		case <-first:
		case <-time.After(5 * time.Second):
			return // the tunnel buffered; the test fails below
		}
		_, _ = w.Write([]byte("data: [DONE]\n\n"))
	})
	s := newSet(t, adapter.Options{}, compatAdapter("llama", llamaProfile(up.URL), 1))
	var frs []*iop.ProviderTunnelFrame
	s.Tunnel(context.Background(), "t", &iop.ProviderTunnelRequest{Adapter: "llama", Operation: protocol.OpChatCompletions, Body: []byte(`{}`)},
		func(f *iop.ProviderTunnelFrame) {
			frs = append(frs, f)
			if f.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_BODY && string(f.GetBody()) == "data: one\n\n" {
				close(first)
			}
		})
	last, _, body, _ := checkTunnel(t, frs)
	if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END || string(body) != "data: one\n\ndata: [DONE]\n\n" {
		t.Fatalf("T2: got %v with body %q; the first chunk was not sent before the second was written", last.GetKind(), body)
	}
}

// T1: operations map to profile paths; unsafe paths never reach upstream.
func TestTunnelPaths(t *testing.T) {
	leakcheck.Check(t)
	up := newFake(t, replay(200, "application/json", []byte(`{}`)))
	p := llamaProfile(up.URL + "/base/")
	p.ResponsesPath = ""
	s := newSet(t, adapter.Options{}, compatAdapter("llama", p, 4))
	cases := []struct {
		name, op, path, method string
		wantPath, wantQuery    string
		code                   string
	}{
		{"T1 models", protocol.OpModels, "", "GET", "/base/v1/models", "", ""},
		{"T1 chat_completions", protocol.OpChatCompletions, "/ignored", "POST", "/base/v1/chat/completions", "", ""},
		{"T1 messages", protocol.OpMessages, "", "POST", "/base/v1/messages", "", ""},
		{"T1 count_tokens", protocol.OpCountTokens, "", "POST", "/base/v1/messages/count_tokens", "", ""},
		{"T1 operation the profile lacks", protocol.OpResponses, "", "POST", "", "", protocol.CodeUnsupportedOperation.String()},
		{"T1 completions", protocol.OpCompletions, "", "POST", "/base/v1/completions", "", ""},
		{"T1 embeddings", protocol.OpEmbeddings, "", "POST", "/base/v1/embeddings", "", ""},
		{"T1 unknown operation", "rerank", "", "POST", "", "", protocol.CodeInvalidRequest.String()},
		{"T1 empty operation falls back to path", "", "/v1/completions?stream=true", "POST", "/base/v1/completions", "stream=true", ""},
		{"T1 relative path joins the base", "", "v1/embeddings", "POST", "/base/v1/embeddings", "", ""},
		{"T1 absolute URL rejected", "", "http://evil.example/v1/models", "GET", "", "", protocol.CodeInvalidRequest.String()},
		{"T1 host rejected", "", "//evil.example/v1/models", "GET", "", "", protocol.CodeInvalidRequest.String()},
		{"T1 dot-dot escaping the base rejected", "", "/v1/../../admin", "GET", "", "", protocol.CodeInvalidRequest.String()},
		{"T1 encoded dot-dot rejected", "", "/v1/%2e%2e/%2E%2E/admin", "GET", "", "", protocol.CodeInvalidRequest.String()},
		{"T1 encoded slash dot-dot rejected", "", "/v1/..%2f..%2fadmin", "GET", "", "", protocol.CodeInvalidRequest.String()},
		{"T1 backslash rejected", "", "/v1\\..\\admin", "GET", "", "", protocol.CodeInvalidRequest.String()},
		{"T1 empty path rejected", "", "", "GET", "", "", protocol.CodeInvalidRequest.String()},
		{"T1 scheme-like path rejected", "", "file:/etc/passwd", "GET", "", "", protocol.CodeInvalidRequest.String()},
		{"T1 bad method rejected", protocol.OpModels, "", "CONNECT", "", "", protocol.CodeInvalidRequest.String()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(up.requests())
			frs := tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny", Operation: tc.op, Path: tc.path, Method: tc.method})
			last, _, _, _ := checkTunnel(t, frs)
			reqs := up.requests()[before:]
			if tc.code != "" {
				if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_ERROR || last.GetFailureCode() != tc.code || len(frs) != 1 {
					t.Fatalf("got %d frames ending %v %q (%q), want a lone ERROR %q", len(frs), last.GetKind(), last.GetFailureCode(), last.GetError(), tc.code)
				}
				if len(reqs) != 0 {
					t.Fatalf("T1: rejected path reached upstream: %+v", reqs)
				}
				return
			}
			if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END || len(reqs) != 1 {
				t.Fatalf("got %v (%q) and %d requests", last.GetKind(), last.GetError(), len(reqs))
			}
			if reqs[0].Path != tc.wantPath || reqs[0].Query != tc.wantQuery || reqs[0].Method != tc.method {
				t.Fatalf("upstream got %s %s?%s, want %s %s?%s", reqs[0].Method, reqs[0].Path, reqs[0].Query, tc.method, tc.wantPath, tc.wantQuery)
			}
		})
	}
}

// T4: only allow-listed headers go upstream; upstream auth comes from the
// adapter's api_key_env; hop-by-hop response headers and cookies stay behind.
func TestTunnelHeaders(t *testing.T) {
	leakcheck.Check(t)
	up := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "session=upstream")
		w.Header().Set("X-Request-Id", "req-1")
		w.Header().Set("Connection", "X-Private")
		w.Header().Set("X-Private", "hop")
		w.Header().Set("Keep-Alive", "timeout=5")
		_, _ = w.Write([]byte(`{}`))
	})
	cases := []struct {
		name, header, scheme, wantName, wantValue string
	}{
		{"T4 bearer from api_key_env", "Authorization", "Bearer", "Authorization", "Bearer sk-node-secret"},
		{"T4 x-api-key without scheme", "x-api-key", "", "X-Api-Key", "sk-node-secret"},
	}
	client := []*iop.Header{
		{Name: "Authorization", Value: "Bearer client-key"},
		{Name: "x-api-key", Value: "client-key"},
		{Name: "Cookie", Value: "c=1"},
		{Name: "Connection", Value: "keep-alive"},
		{Name: "Transfer-Encoding", Value: "chunked"},
		{Name: "X-Iop-Node", Value: "gpu-1"},
		{Name: "X-Forwarded-For", Value: "10.0.0.1"},
		{Name: "Host", Value: "evil.example"},
		{Name: "content-type", Value: "application/json"},
		{Name: "Accept", Value: "text/event-stream"},
		{Name: "anthropic-version", Value: "2023-06-01"},
		{Name: "anthropic-beta", Value: "tools-2024"},
		{Name: "OpenAI-Beta", Value: "assistants=v2"},
		{Name: "Accept", Value: "bad\r\nInjected: yes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := llamaProfile(up.URL)
			p.AuthHeader, p.AuthScheme = tc.header, tc.scheme
			ac := compatAdapter("api", p, 1)
			ac.ApiKeyEnv = "IOP_TEST_KEY"
			env := func(k string) (string, bool) { return "sk-node-secret", k == "IOP_TEST_KEY" }
			s := newSet(t, adapter.Options{LookupEnv: env, AllowEnv: func(k string) bool { return k == "IOP_TEST_KEY" }}, ac)
			before := len(up.requests())
			frs := tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "api", Target: "m", Operation: protocol.OpMessages, Headers: client, Body: []byte(`{}`)})
			checkTunnel(t, frs)
			got := up.requests()[before].Header
			for name := range got {
				switch name {
				case "Content-Type", "Accept", "Anthropic-Version", "Anthropic-Beta", "Openai-Beta", "User-Agent", "Accept-Encoding", "Content-Length", tc.wantName:
				default:
					t.Errorf("T4: header %s forwarded upstream", name)
				}
			}
			if v := got.Values(tc.wantName); len(v) != 1 || v[0] != tc.wantValue {
				t.Errorf("T4: upstream %s = %q, want only %q", tc.wantName, v, tc.wantValue)
			}
			if got.Get("Anthropic-Version") != "2023-06-01" || got.Get("Openai-Beta") != "assistants=v2" || got.Get("Accept") != "text/event-stream" {
				t.Errorf("T4: allow-listed headers lost: %v", got)
			}
			if strings.Contains(strings.Join(got.Values("Accept"), ","), "Injected") {
				t.Errorf("T4: header with a line break forwarded")
			}
			for _, h := range frs[0].GetHeaders() {
				switch h.GetName() {
				case "Set-Cookie", "Connection", "Keep-Alive", "X-Private", "Transfer-Encoding":
					t.Errorf("T2: response header %s relayed", h.GetName())
				}
			}
			if !hasHeader(frs[0].GetHeaders(), "X-Request-Id", "req-1") || !hasHeader(frs[0].GetHeaders(), "Content-Type", "application/json") {
				t.Errorf("T2: end-to-end response headers missing: %v", frs[0].GetHeaders())
			}
			for _, f := range frs {
				if strings.Contains(f.String(), "sk-node-secret") {
					t.Fatalf("P4: the upstream key appears in a frame")
				}
			}
		})
	}
}

func hasHeader(hs []*iop.Header, name, value string) bool {
	for _, h := range hs {
		if h.GetName() == name && h.GetValue() == value {
			return true
		}
	}
	return false
}

// E1, E2, C4: tunnel boundary checks end in a lone ERROR, no upstream call.
func TestTunnelBoundary(t *testing.T) {
	leakcheck.Check(t)
	up := newFake(t, replay(200, "application/json", []byte(`{}`)))
	s := newSet(t, adapter.Options{}, compatAdapter("a", llamaProfile(up.URL), 1), compatAdapter("b", llamaProfile(up.URL), 1))
	cases := []struct {
		name string
		req  *iop.ProviderTunnelRequest
		code string
	}{
		{"E1 unknown adapter", &iop.ProviderTunnelRequest{Adapter: "nope", Operation: protocol.OpModels}, protocol.CodeUnknownAdapter.String()},
		{"E1 empty adapter among several, none named openai_compat", &iop.ProviderTunnelRequest{Operation: protocol.OpModels}, protocol.CodeUnknownAdapter.String()},
		{"E2 negative stall timeout", &iop.ProviderTunnelRequest{Adapter: "a", Operation: protocol.OpModels, ResponseStallTimeoutMs: -1}, protocol.CodeInvalidRequest.String()},
		{"E2 stall timeout too large", &iop.ProviderTunnelRequest{Adapter: "a", Operation: protocol.OpModels, ResponseStallTimeoutMs: 1 << 62}, protocol.CodeInvalidRequest.String()},
		{"C4 binding without lease", &iop.ProviderTunnelRequest{Adapter: "a", Operation: protocol.OpModels, CredentialBinding: &iop.CredentialLeaseBinding{}}, protocol.CodeCredentialInvalid.String()},
		{"C4 lease while the plane is off", &iop.ProviderTunnelRequest{Adapter: "a", Operation: protocol.OpModels,
			CredentialLease: &iop.CredentialLease{}, CredentialBinding: &iop.CredentialLeaseBinding{}}, protocol.CodeCredentialInvalid.String()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			frs := tunnelAll(context.Background(), s, tc.req)
			last, _, _, _ := checkTunnel(t, frs)
			if len(frs) != 1 || last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_ERROR || last.GetFailureCode() != tc.code {
				t.Fatalf("got %d frames ending %v %q (%q), want a lone ERROR %q", len(frs), last.GetKind(), last.GetFailureCode(), last.GetError(), tc.code)
			}
		})
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("%d upstream calls after rejected tunnels", n)
	}
}

// T1: an "ollama" instance tunnels to Ollama's OpenAI- and
// Anthropic-compatible endpoints (Ollama 0.17.4: no count_tokens).
func TestTunnelOllamaInstance(t *testing.T) {
	leakcheck.Check(t)
	want := sample(t, "ollama_v1_chat_stream.sse")
	up := newFake(t, replay(200, "text/event-stream", want))
	s := newSet(t, adapter.Options{}, ollamaAdapter("", up.URL, 1))
	for _, tc := range []struct{ op, path string }{{protocol.OpChatCompletions, "/v1/chat/completions"}, {protocol.OpMessages, "/v1/messages"},
		{protocol.OpModels, "/v1/models"}, {protocol.OpResponses, "/v1/responses"}, {protocol.OpCompletions, "/v1/completions"},
		{protocol.OpEmbeddings, "/v1/embeddings"}} {
		last, _, body, usages := checkTunnel(t, tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Target: "tiny", Operation: tc.op, Body: []byte(`{}`)}))
		reqs := up.requests()
		if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END || reqs[len(reqs)-1].Path != tc.path || !bytes.Equal(body, want) || len(usages) != 1 {
			t.Fatalf("T1 %s: got %v %q to %s", tc.op, last.GetKind(), last.GetError(), reqs[len(reqs)-1].Path)
		}
	}
	last, _, _, _ := checkTunnel(t, tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Operation: protocol.OpCountTokens}))
	if last.GetFailureCode() != protocol.CodeUnsupportedOperation.String() {
		t.Fatalf("T1 count_tokens on ollama (Ollama 0.17.4 has none): got %q, want unsupported_operation", last.GetFailureCode())
	}
}
