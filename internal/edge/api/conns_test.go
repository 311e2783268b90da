package api

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/leakcheck"
	"iop/internal/proctest"
	"iop/internal/protocol"
)

// connRig is a Handler on a real HTTP server wired as the Edge wires it
// (ConnContext, ConnState), with key team-a and http.max_connections max,
// whose hooks report every accept and state change, so the test knows
// what the server saw without sleeping.
type connRig struct {
	h      *Handler
	srv    *httptest.Server
	addr   string
	events chan http.ConnState // StateNew at accept, then each change
}

const connKeyA = "sk-secret-a"

func newConnRig(t *testing.T, max int, open bool) *connRig {
	t.Helper()
	keys := map[string]string{"team-a": connKeyA}
	if open {
		keys = nil
	}
	cfg := testConfig(keys)
	cfg.HTTP.MaxConnections = max
	r := &connRig{events: make(chan http.ConnState, 1<<14)}
	r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: newFakePool(protocol.TypeOllama),
		Dispatcher: newFakeDispatcher(newFakeStream("run-1")), Now: fixedNow, NewID: seqIDs(),
		Logger: slog.New(slog.NewTextHandler(&proctest.Log{}, nil))})
	r.srv = httptest.NewUnstartedServer(r.h)
	r.srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		ctx = r.h.ConnContext(ctx, c)
		r.events <- http.StateNew
		return ctx
	}
	r.srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		r.h.ConnState(c, s)
		if s != http.StateNew {
			r.events <- s
		}
	}
	r.srv.Start()
	r.addr = r.srv.Listener.Addr().String()
	t.Cleanup(r.srv.Close)
	return r
}

// wait waits until the server reported n more events of state s.
func (r *connRig) wait(t *testing.T, s http.ConnState, n int) {
	t.Helper()
	deadline := time.After(waitFor)
	for n > 0 {
		select {
		case got := <-r.events:
			if got == s {
				n--
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %d more %v connections", n, s)
		}
	}
}

// rawConn is one client connection driven by hand, as an attacker would.
type rawConn struct {
	c  net.Conn
	br *bufio.Reader
}

func (r *connRig) dial(t *testing.T) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{c: c, br: bufio.NewReader(c)}
}

// get sends GET path (with key, when set) and returns the status, or 0
// when the connection was closed instead of answered.
func (rc *rawConn) get(t *testing.T, path, key string) int {
	t.Helper()
	rc.c.SetDeadline(time.Now().Add(waitFor))
	head := "GET " + path + " HTTP/1.1\r\nHost: x\r\n"
	if key != "" {
		head += "Authorization: Bearer " + key + "\r\n"
	}
	if _, err := io.WriteString(rc.c, head+"\r\n"); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		if closedErr(err) {
			return 0
		}
		t.Fatalf("GET %s: %v", path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// shed reports whether the server closed rc (EOF or reset on a read).
func (rc *rawConn) shed(t *testing.T) bool {
	t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(waitFor))
	_, err := rc.br.ReadByte()
	if err == nil {
		t.Fatal("the server sent bytes nobody asked for")
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	return closedErr(err)
}

func closedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// served sends n requests with team-a's key, each on a new connection
// closed after its answer, and returns their statuses.
func (r *connRig) served(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	for range n {
		rc := r.dial(t)
		out = append(out, rc.get(t, "/v1/models", connKeyA))
		rc.c.Close()
	}
	return out
}

func all(statuses []int, want int) bool {
	for _, s := range statuses {
		if s != want {
			return false
		}
	}
	return len(statuses) > 0
}

// Clients without a key cannot crowd out clients with one
// (http.max_connections; conns.go, docs/operating.md "Client
// connections"), tested the way an attacker would hold connections: idle
// keep-alive connections that asked /healthz (no key needed), connections
// that never send a byte, a flood of new ones, each against a bound of
// max connections.
func TestConnectionShedding(t *testing.T) {
	rows := []struct {
		name string
		max  int
		open bool // no api_keys
		run  func(t *testing.T, r *connRig)
	}{
		{name: "max+1 idle /healthz connections: every keyed request on a new connection is served", max: 50,
			run: func(t *testing.T, r *connRig) {
				var idle []*rawConn
				for range 51 {
					rc := r.dial(t)
					if s := rc.get(t, "/healthz", ""); s != 200 {
						t.Fatalf("healthz: %d", s)
					}
					// Idle on the server before the next one dials: the
					// client has its answer before net/http marks the
					// connection idle, and on a loaded machine the next
					// connection could be marked first and be the
					// longest quiet.
					r.wait(t, http.StateIdle, 1)
					idle = append(idle, rc)
				}
				if got := r.served(t, 20); !all(got, 200) {
					t.Fatalf("keyed requests got %v, want 200 each", got)
				}
				if !idle[0].shed(t) {
					t.Error("the longest-idle connection without a key was not shed, yet keyed clients got slots beyond the bound")
				}
			}},
		// B2: a /healthz request (no key needed) that declares a body and never
		// sends it: net/http reads an unread body of up to 256 KiB before it
		// writes the answer, so unless the edge closes such a connection
		// after the answer it stays serving that request, which is never
		// shed.
		{name: "max+1 /healthz requests holding a declared body: every keyed request on a new connection is served", max: 50,
			run: func(t *testing.T, r *connRig) {
				for _, line := range []string{"GET /healthz", "POST /healthz", "HEAD /healthz"} {
					for range 17 {
						rc := r.dial(t)
						if _, err := io.WriteString(rc.c, line+" HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{"); err != nil {
							t.Fatal(err)
						}
						r.wait(t, http.StateActive, 1) // one at a time: none is still fresh, and shed, at the next accept
					}
				}
				if got := r.served(t, 20); !all(got, 200) {
					t.Fatalf("keyed requests got %v, want 200 each", got)
				}
			}},
		{name: "connections that never send a byte crowd out nobody", max: 10,
			run: func(t *testing.T, r *connRig) {
				for range 30 {
					r.dial(t)
				}
				r.wait(t, http.StateNew, 30)
				if got := r.served(t, 10); !all(got, 200) {
					t.Fatalf("keyed requests got %v, want 200 each", got)
				}
			}},
		{name: "a flood of connections without a key never sheds a keyed client's idle connections", max: 8,
			run: func(t *testing.T, r *connRig) {
				var keyed []*rawConn
				for range 4 {
					rc := r.dial(t)
					if s := rc.get(t, "/v1/models", connKeyA); s != 200 {
						t.Fatalf("keyed: %d", s)
					}
					keyed = append(keyed, rc)
				}
				r.wait(t, http.StateIdle, 4)
				for range 200 {
					rc := r.dial(t)
					if s := rc.get(t, "/healthz", ""); s != 200 && s != 0 {
						t.Fatalf("healthz: %d", s)
					}
					rc.c.SetDeadline(time.Time{})
				}
				for i, rc := range keyed {
					if s := rc.get(t, "/v1/models", connKeyA); s != 200 {
						t.Fatalf("keyed connection %d after the flood: %d, want 200 on the same connection", i, s)
					}
				}
			}},
		{name: "every slot keyed and idle: a keyed request over the bound takes the longest-idle one's", max: 3,
			run: func(t *testing.T, r *connRig) {
				var keyed []*rawConn
				for range 3 {
					rc := r.dial(t)
					if s := rc.get(t, "/v1/models", connKeyA); s != 200 {
						t.Fatalf("keyed: %d", s)
					}
					keyed = append(keyed, rc)
					r.wait(t, http.StateIdle, 1) // in this order
				}
				nc := r.dial(t)
				if s := nc.get(t, "/healthz", ""); s != 200 {
					t.Fatalf("healthz over the bound: %d", s)
				}
				if s := nc.get(t, "/v1/models", ""); s != 503 {
					t.Fatalf("a request without a key over the bound: %d, want 503 too_many_connections", s)
				}
				nc = r.dial(t)
				if s := nc.get(t, "/v1/models", connKeyA); s != 200 {
					t.Fatalf("a keyed request over the bound: %d, want 200", s)
				}
				if !keyed[0].shed(t) {
					t.Error("the longest-idle keyed connection was not the one shed")
				}
				if s := keyed[2].get(t, "/v1/models", connKeyA); s != 200 {
					t.Errorf("a newer keyed connection: %d, want 200", s)
				}
				if s := nc.get(t, "/v1/models", connKeyA); s != 200 {
					t.Errorf("the connection that claimed a slot, again: %d, want 200", s)
				}
			}},
		{name: "open mode: a new connection takes the slot of the longest-quiet one", max: 2, open: true,
			run: func(t *testing.T, r *connRig) {
				a, b := r.dial(t), r.dial(t)
				for _, rc := range []*rawConn{a, b} {
					if s := rc.get(t, "/v1/models", ""); s != 200 {
						t.Fatalf("open mode: %d", s)
					}
					r.wait(t, http.StateIdle, 1)
				}
				if s := r.dial(t).get(t, "/v1/models", ""); s != 200 {
					t.Fatalf("a third connection: %d, want 200", s)
				}
				if !a.shed(t) {
					t.Error("the longest-quiet connection was not shed")
				}
			}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			r := newConnRig(t, row.max, row.open)
			row.run(t, r)
			r.srv.CloseClientConnections()
			r.srv.Close()
			if n, over := r.h.lim.conns.open(); n != 0 || over != 0 {
				t.Errorf("connections still counted after every connection closed: %d (%d over the bound)", n, over)
			}
		})
	}
}
