package adapter_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// fakeManaged is a ManagedBackend whose one model "tiny" is served at base
// once load (if set) is closed; err fails every Acquire.
type fakeManaged struct {
	base *url.URL
	load chan struct{}
	err  error

	mu                 sync.Mutex
	acquired, released int
}

func (f *fakeManaged) Acquire(ctx context.Context, model string) (*url.URL, func(), error) {
	if f.err != nil {
		return nil, nil, f.err
	}
	if model != "tiny" {
		return nil, nil, errors.New("model unavailable: no such model")
	}
	if f.load != nil {
		select {
		case <-f.load:
		case <-ctx.Done():
			return nil, nil, context.Cause(ctx)
		}
	}
	f.mu.Lock()
	f.acquired++
	f.mu.Unlock()
	return f.base, sync.OnceFunc(func() { f.mu.Lock(); f.released++; f.mu.Unlock() }), nil
}

func (f *fakeManaged) Loaded(model string) (*url.URL, string) {
	if model != "tiny" {
		return nil, ""
	}
	return f.base, protocol.ResidencyLoaded
}

func (f *fakeManaged) Models() ([]string, error) { return []string{"tiny"}, nil }

func (f *fakeManaged) Report() []*iop.ModelResidency {
	return []*iop.ModelResidency{{Model: "tiny", State: protocol.ResidencyLoaded}}
}

func (f *fakeManaged) counts() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.acquired, f.released
}

func managedAdapter(name string, capacity int32) *iop.AdapterConfig {
	a := compatAdapter(name, llamaProfile("http://127.0.0.1:1"), capacity) // base_url unused
	a.Managed = "llama"
	return a
}

// U2: a managed adapter's run and tunnel go to the process Acquire names,
// release it once after the call, and fail with model_unavailable (or
// timeout, or CANCELLED) when the model cannot be had.
func TestManagedAdapter(t *testing.T) {
	leakcheck.Check(t)
	up := newFake(t, replay(200, "text/event-stream", sample(t, "llama_v1_chat_stream.sse")))
	u, _ := url.Parse(up.URL)
	t.Run("U2 tunnel reaches the process and releases it", func(t *testing.T) {
		fm := &fakeManaged{base: u}
		s := newSet(t, adapter.Options{Managed: map[string]adapter.ManagedBackend{"llama": fm}}, managedAdapter("llama", 2))
		last, status, _, _ := checkTunnel(t, tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny",
			Operation: protocol.OpChatCompletions, Method: "POST", Body: []byte(`{"model":"tiny"}`), Stream: true}))
		if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END || status != 200 {
			t.Fatalf("%v %q %d", last.GetKind(), last.GetError(), status)
		}
		if a, r := fm.counts(); a != 1 || r != 1 {
			t.Fatalf("acquired %d released %d", a, r)
		}
		models, err := s.ListModels(context.Background(), "llama")
		if err != nil || len(models) != 1 || models[0] != "tiny" {
			t.Fatalf("models %v %v", models, err)
		}
	})
	t.Run("U2 run reaches the process", func(t *testing.T) {
		fm := &fakeManaged{base: u}
		s := newSet(t, adapter.Options{Managed: map[string]adapter.ManagedBackend{"llama": fm}}, managedAdapter("llama", 2))
		last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Adapter: "llama", Target: "tiny", Input: userInput("hi"), Stream: true}))
		if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
			t.Fatalf("%v %q", last.GetType(), last.GetError())
		}
		if a, r := fm.counts(); a != 1 || r != 1 {
			t.Fatalf("acquired %d released %d", a, r)
		}
	})
	t.Run("U3 model_unavailable", func(t *testing.T) {
		fm := &fakeManaged{err: errors.New("model unavailable: no memory")}
		s := newSet(t, adapter.Options{Managed: map[string]adapter.ManagedBackend{"llama": fm}}, managedAdapter("llama", 2))
		last, _, _, _ := checkTunnel(t, tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny",
			Operation: protocol.OpChatCompletions, Method: "POST", Body: []byte(`{}`)}))
		if last.GetFailureCode() != protocol.CodeModelUnavailable.String() || !strings.Contains(last.GetError(), "no memory") {
			t.Fatalf("%v %q %q", last.GetKind(), last.GetFailureCode(), last.GetError())
		}
		runLast, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Adapter: "llama", Target: "tiny", Input: userInput("hi")}))
		if runLast.GetFailureCode() != protocol.CodeModelUnavailable.String() {
			t.Fatalf("run: %q", runLast.GetFailureCode())
		}
	})
	t.Run("U2 the load uses up timeout_sec", func(t *testing.T) {
		fm := &fakeManaged{base: u, load: make(chan struct{})} // never loads
		s := newSet(t, adapter.Options{Managed: map[string]adapter.ManagedBackend{"llama": fm}}, managedAdapter("llama", 2))
		start := time.Now()
		last, _, _, _ := checkTunnel(t, tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny",
			Operation: protocol.OpChatCompletions, Method: "POST", Body: []byte(`{}`), TimeoutSec: 1}))
		if last.GetFailureCode() != protocol.CodeTimeout.String() || time.Since(start) < time.Second {
			t.Fatalf("%q %q after %v", last.GetFailureCode(), last.GetError(), time.Since(start))
		}
	})
	t.Run("U2 a cancel while loading is CANCELLED", func(t *testing.T) {
		fm := &fakeManaged{base: u, load: make(chan struct{})}
		s := newSet(t, adapter.Options{Managed: map[string]adapter.ManagedBackend{"llama": fm}}, managedAdapter("llama", 2))
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(20*time.Millisecond, cancel)
		last, _ := checkRun(t, runAll(ctx, s, &iop.RunRequest{Adapter: "llama", Target: "tiny", Input: userInput("hi")}))
		if last.GetType() != iop.RunEventType_RUN_EVENT_CANCELLED {
			t.Fatalf("%v %q", last.GetType(), last.GetError())
		}
	})
}

// U1: an adapter may name only a managed backend of the node's own config.
func TestManagedAdapterUnknownBackend(t *testing.T) {
	_, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: []*iop.AdapterConfig{managedAdapter("llama", 1)}}, adapter.Options{})
	if !errors.Is(err, adapter.ErrUnknownManaged) || !strings.Contains(err.Error(), `"llama"`) {
		t.Fatalf("err %v", err)
	}
}
