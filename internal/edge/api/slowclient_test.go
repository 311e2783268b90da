package api

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
)

// slowRig serves the Handler with a short body-read timeout.
func slowRig(t *testing.T, keys map[string]string, bodyTimeout time.Duration) (*rig, string) {
	t.Helper()
	r := &rig{fp: newFakePool(protocol.TypeOllama), st: newFakeStream("run-1"), cfg: testConfig(keys)}
	r.p = r.fp
	r.d = newFakeDispatcher(r.st)
	cfg := r.cfg
	r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: r.d, Now: fixedNow, NewID: seqIDs(),
		BodyReadTimeout: bodyTimeout})
	r.srv = httptest.NewServer(r.h)
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.st.kill)
	return r, strings.TrimPrefix(r.srv.URL, "http://")
}

// rawRequest writes head and a partial body on a fresh connection and
// returns the status line and whether the server then closed the
// connection, both within deadline.
func rawRequest(t *testing.T, addr, head, partial string, deadline time.Duration) (status string, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(deadline))
	if _, err := io.WriteString(c, head+partial); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no response within %v: %v", deadline, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_, err = br.ReadByte()
	return resp.Status, err == io.EOF
}

// A client that declares a body and never sends it cannot hold a
// connection: refused requests are answered and closed at once, and a
// stalled body read ends with 408.
func TestSlowClients(t *testing.T) {
	leakcheck.Check(t)
	keys := map[string]string{"p": "k"}
	r, addr := slowRig(t, keys, 200*time.Millisecond)
	_ = r
	head := func(auth string) string {
		h := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"
		if auth != "" {
			h += "Authorization: Bearer " + auth + "\r\n"
		}
		return h + "\r\n"
	}
	t.Run("401 with an unsent body closes at once", func(t *testing.T) {
		status, closed := rawRequest(t, addr, head(""), "{", 2*time.Second)
		if !strings.HasPrefix(status, "401") || !closed {
			t.Errorf("got %q closed=%v, want 401 and a closed connection", status, closed)
		}
	})
	t.Run("404 with an unsent body closes at once", func(t *testing.T) {
		status, closed := rawRequest(t, addr, strings.Replace(head("k"), "/v1/chat/completions", "/v1/nope", 1), "{", 2*time.Second)
		if !strings.HasPrefix(status, "404") || !closed {
			t.Errorf("got %q closed=%v, want 404 and a closed connection", status, closed)
		}
	})
	t.Run("stalled body gets 408", func(t *testing.T) {
		status, closed := rawRequest(t, addr, head("k"), `{"model":`, 3*time.Second)
		if !strings.HasPrefix(status, "408") || !closed {
			t.Errorf("got %q closed=%v, want 408 and a closed connection", status, closed)
		}
	})
}
