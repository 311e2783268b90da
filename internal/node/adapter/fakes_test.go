package adapter_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"iop/internal/node/adapter"
	"iop/internal/protocol"
	"iop/internal/samples"
	iop "iop/proto/gen/iop"
)

// fake is an upstream backend: an httptest server recording requests.
type fake struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []recorded
}

type recorded struct {
	Method, Path, Query string
	Header              http.Header
	Body                []byte
}

// newFake starts a backend whose handler sees the request body already read
// (the server then notices a client that goes away).
func newFake(t testing.TB, h func(w http.ResponseWriter, r *http.Request, body []byte)) *fake {
	t.Helper()
	f := &fake{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.reqs = append(f.reqs, recorded{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body})
		f.mu.Unlock()
		h(w, r, body)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fake) requests() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.reqs...)
}

// replay answers with status and body, flushing after every SSE event or
// NDJSON line so the client sees a real stream.
func replay(status int, contentType string, body []byte) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		rc := http.NewResponseController(w)
		for _, part := range splitKeep(body) {
			if _, err := w.Write(part); err != nil {
				return
			}
			_ = rc.Flush()
		}
	}
}

// splitKeep splits b after every "\n\n" (SSE) or, without those, after every
// "\n" (NDJSON), keeping every byte.
func splitKeep(b []byte) [][]byte {
	sep := []byte("\n\n")
	if !bytes.Contains(b, sep) {
		sep = []byte("\n")
	}
	var out [][]byte
	for len(b) > 0 {
		i := bytes.Index(b, sep)
		if i < 0 {
			out = append(out, b)
			break
		}
		out = append(out, b[:i+len(sep)])
		b = b[i+len(sep):]
	}
	return out
}

// resetAfter writes parts with flushes, then drops the connection without
// finishing the response (an upstream reset mid-stream).
func resetAfter(contentType string, parts ...[]byte) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", contentType)
		rc := http.NewResponseController(w)
		for _, p := range parts {
			_, _ = w.Write(p)
			_ = rc.Flush()
		}
		conn, _, err := rc.Hijack()
		if err == nil {
			conn.Close()
		}
	}
}

// Config builders.

func ollamaAdapter(name, base string, capacity int32) *iop.AdapterConfig {
	return &iop.AdapterConfig{Name: name, Type: protocol.TypeOllama, BaseUrl: base, Capacity: capacity}
}

func llamaProfile(base string) *iop.ConcreteProtocolProfile {
	return &iop.ConcreteProtocolProfile{
		Name: "llamacpp", BaseUrl: base, AuthHeader: "Authorization", AuthScheme: "Bearer",
		ModelsPath: "/v1/models", ChatCompletionsPath: "/v1/chat/completions", MessagesPath: "/v1/messages",
		CountTokensPath: "/v1/messages/count_tokens", ResponsesPath: "/v1/responses",
		CompletionsPath: "/v1/completions", EmbeddingsPath: "/v1/embeddings",
		NativeTools: true, HealthPath: "/health",
	}
}

func compatAdapter(name string, p *iop.ConcreteProtocolProfile, capacity int32) *iop.AdapterConfig {
	return &iop.AdapterConfig{Name: name, Type: protocol.TypeOpenAICompat, Capacity: capacity,
		OpenaiCompat: &iop.OpenAICompatAdapterConfig{ProtocolProfile: p}}
}

// newSet builds a Set and closes it when the test ends.
func newSet(t testing.TB, o adapter.Options, adapters ...*iop.AdapterConfig) *adapter.Set {
	t.Helper()
	s, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: adapters}, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Run and tunnel collection and grammar checks.

func runAll(ctx context.Context, s *adapter.Set, req *iop.RunRequest) []*iop.RunEvent {
	var evs []*iop.RunEvent
	s.Run(ctx, "run-1", req, func(ev *iop.RunEvent) { evs = append(evs, ev) })
	return evs
}

// checkRun asserts SPEC E3 — START, DELTA*, exactly one terminal, seq 1, 2,
// 3… — and returns the terminal and the concatenated deltas.
func checkRun(t testing.TB, evs []*iop.RunEvent) (*iop.RunEvent, string) {
	t.Helper()
	if len(evs) < 2 {
		t.Fatalf("E3: got %d events, want at least START and a terminal", len(evs))
	}
	var deltas strings.Builder
	for i, ev := range evs {
		if ev.GetSeq() != uint64(i+1) {
			t.Fatalf("E3: event %d has seq %d, want %d", i, ev.GetSeq(), i+1)
		}
		want := iop.RunEventType_RUN_EVENT_DELTA
		switch {
		case i == 0:
			want = iop.RunEventType_RUN_EVENT_START
		case i == len(evs)-1:
			switch ev.GetType() {
			case iop.RunEventType_RUN_EVENT_COMPLETE, iop.RunEventType_RUN_EVENT_ERROR, iop.RunEventType_RUN_EVENT_CANCELLED:
				want = ev.GetType()
			default:
				t.Fatalf("E3: last event is %v, want a terminal", ev.GetType())
			}
		}
		if ev.GetType() != want {
			t.Fatalf("E3: event %d is %v, want %v", i, ev.GetType(), want)
		}
		if ev.GetType() == iop.RunEventType_RUN_EVENT_DELTA {
			deltas.WriteString(ev.GetDelta())
		}
	}
	last := evs[len(evs)-1]
	if last.GetType() == iop.RunEventType_RUN_EVENT_ERROR && (last.GetError() == "" || last.GetFailureCode() == "") {
		t.Fatalf("H4: ERROR without error or failure_code: %v", last)
	}
	return last, deltas.String()
}

func tunnelAll(ctx context.Context, s *adapter.Set, req *iop.ProviderTunnelRequest) []*iop.ProviderTunnelFrame {
	var frs []*iop.ProviderTunnelFrame
	s.Tunnel(ctx, "tun-1", req, func(f *iop.ProviderTunnelFrame) { frs = append(frs, f) })
	return frs
}

// checkTunnel asserts SPEC T2 — RESPONSE_START? (BODY|USAGE)* (END|ERROR),
// seq 1, 2, 3…, BODY ≤ 32 KiB — and returns the terminal, the status (0
// without RESPONSE_START), the concatenated body and the usages.
func checkTunnel(t testing.TB, frs []*iop.ProviderTunnelFrame) (last *iop.ProviderTunnelFrame, status int32, body []byte, usages []*iop.Usage) {
	t.Helper()
	if len(frs) == 0 {
		t.Fatal("T2: no frames")
	}
	for i, f := range frs {
		if f.GetSeq() != uint64(i+1) {
			t.Fatalf("T2: frame %d has seq %d, want %d", i, f.GetSeq(), i+1)
		}
		terminal := f.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_END || f.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_ERROR
		if terminal != (i == len(frs)-1) {
			t.Fatalf("T2: frame %d (%v): a terminal must be last and only last", i, f.GetKind())
		}
		switch f.GetKind() {
		case iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START:
			if i != 0 {
				t.Fatalf("T2: RESPONSE_START at frame %d, want only first", i)
			}
			status = f.GetStatus()
		case iop.TunnelFrameKind_TUNNEL_FRAME_BODY:
			if status == 0 {
				t.Fatalf("T2: BODY before RESPONSE_START")
			}
			if len(f.GetBody()) == 0 || len(f.GetBody()) > adapter.MaxBodyFrame {
				t.Fatalf("T2: BODY of %d bytes, want 1..%d", len(f.GetBody()), adapter.MaxBodyFrame)
			}
			body = append(body, f.GetBody()...)
		case iop.TunnelFrameKind_TUNNEL_FRAME_USAGE:
			if status == 0 {
				t.Fatalf("T2: USAGE before RESPONSE_START")
			}
			usages = append(usages, f.GetUsage())
		case iop.TunnelFrameKind_TUNNEL_FRAME_END, iop.TunnelFrameKind_TUNNEL_FRAME_ERROR:
		default:
			t.Fatalf("T2: frame %d has kind %v", i, f.GetKind())
		}
	}
	last = frs[len(frs)-1]
	if last.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_ERROR && (last.GetError() == "" || last.GetFailureCode() == "") {
		t.Fatalf("H4: ERROR without error or failure_code: %v", last)
	}
	return last, status, body, usages
}

func userInput(text string) *iop.RunInput {
	return &iop.RunInput{Messages: []*iop.ChatMessage{{Role: "user", Content: text}}}
}

func sample(t testing.TB, name string) []byte { t.Helper(); return samples.Read(t, name) }

func httpSample(t testing.TB, name string) (int, []byte) {
	t.Helper()
	return samples.ReadHTTP(t, name)
}
