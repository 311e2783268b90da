package edge

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/access"
	"iop/internal/edge/api"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
	"iop/internal/proctest"
)

// drainConfig is an open-mode edge config with one model group.
const drainConfig = `{
  "tls": {"cert_file": "e.crt", "key_file": "e.key", "ca_file": "ca.crt"},
  "nodes": [{"id": "gpu-1", "adapters": [{"type": "ollama", "base_url": "http://127.0.0.1:1"}]}],
  "models": [{"name": "tiny", "providers": [{"node": "gpu-1", "provider": "ollama", "target": "tiny"}]}]
}`

// A3, A1 (every request one terminal and one access line, exit after the
// drain): a request whose client holds its handler — here one that
// declared a body and never sends it, so Handler.Stop cannot end it — is
// ended by closing its connection, and drainHTTP returns only once its
// handler has returned and written its access line. Before, drainHTTP
// returned with the handler still running (the body read waits up to
// http's 30 s read timeout), and the process could exit before the line.
func TestDrainHTTPWaitsForHeldHandlers(t *testing.T) {
	leakcheck.Check(t)
	cfg, err := config.Parse([]byte(drainConfig))
	if err != nil {
		t.Fatal(err)
	}
	logs := &proctest.Log{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	h := api.New(api.Options{Config: func() *config.Config { return cfg }, AccessLog: log, BodyReadTimeout: time.Minute})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	defer func() {
		srv.Close()
		<-served
	}()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const head = "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n" +
		"X-Request-Id: held-body\r\nContent-Length: 1000\r\n\r\n{\"model\":\"tiny\""
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	// The handler is inside ServeHTTP once InFlight counts it (a counter
	// with no event to wait on: polled on a ticker, bounded).
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for h.InFlight() != 1 {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("the request never reached the handler (in flight %d)", h.InFlight())
		}
	}

	began := time.Now()
	drainHTTP(log, srv, h, 20*time.Millisecond, 2*time.Second)
	if n := h.InFlight(); n != 0 {
		t.Fatalf("drainHTTP returned with %d request handlers still running", n)
	}
	if took := time.Since(began); took > 8*time.Second {
		t.Errorf("drainHTTP took %v", took)
	}
	var lines int
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"msg":"`+access.Msg+`"`) && strings.Contains(l, `"request_id":"held-body"`) {
			lines++
		}
	}
	if lines != 1 {
		t.Errorf("%d access lines for the held request, want 1; log:\n%s", lines, logs.String())
	}
}
