package api

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/pool"
	"iop/internal/leakcheck"
	"iop/internal/proctest"
)

// heldPool admits nothing: each Acquire waits until release is closed (or
// the request's context ends) and then fails with ErrUnknownModel (a 404).
// entered counts the Acquire calls.
type heldPool struct {
	entered atomic.Int32
	in      chan struct{} // one send per Acquire (buffered by the test)
	release chan struct{}
}

func (p *heldPool) Acquire(ctx context.Context, _ pool.Request) (*pool.Lease, error) {
	p.entered.Add(1)
	select {
	case p.in <- struct{}{}:
	default:
	}
	select {
	case <-p.release:
		return nil, pool.ErrUnknownModel
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (p *heldPool) Release(*pool.Lease) bool { return true }

// limitRig is a Handler on a real HTTP server with the connection hooks
// wired as the Edge wires them, a heldPool and a captured log.
type limitRig struct {
	h    *Handler
	p    *heldPool
	srv  *httptest.Server
	log  *proctest.Log
	addr string
}

func newLimitRig(t *testing.T, mutate func(*config.Config)) *limitRig {
	t.Helper()
	cfg := testConfig(map[string]string{"team-a": "sk-secret-a"})
	cfg.HTTP.MaxBodyBytes = 1 << 20
	mutate(cfg)
	r := &limitRig{p: &heldPool{in: make(chan struct{}, 1000), release: make(chan struct{})}, log: &proctest.Log{}}
	r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: newFakeDispatcher(newFakeStream("run-1")),
		Now: fixedNow, NewID: seqIDs(), Logger: slog.New(slog.NewTextHandler(r.log, nil))})
	r.srv = httptest.NewUnstartedServer(r.h)
	r.srv.Config.ConnContext = r.h.ConnContext
	r.srv.Config.ConnState = r.h.ConnState
	r.srv.Start()
	r.addr = r.srv.Listener.Addr().String()
	t.Cleanup(r.srv.Close)
	t.Cleanup(func() {
		select {
		case <-r.p.release:
		default:
			close(r.p.release)
		}
	})
	return r
}

// post sends a chat request with key on its own connection.
func (r *limitRig) post(ctx context.Context, client *http.Client, path, key string) (*http.Response, string, error) {
	req, _ := http.NewRequestWithContext(ctx, "POST", r.srv.URL+path, strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// holdConn opens a connection that sent a request head and part of its
// body; it returns once the server has read all of it.
func holdConn(t *testing.T, addr string, wl *waitingListener, head, part string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, head+part); err != nil {
		t.Fatal(err)
	}
	if wl != nil {
		select {
		case <-wl.waiting:
		case <-time.After(waitFor):
			t.Fatal("the server did not read the held request")
		}
	}
	return c
}

// progressWait bounds the wait for the next answer of a burst.
const progressWait = 30 * time.Second

// B2: api_keys[].max_concurrent and requests_per_minute are exact
// under 1,000 concurrent requests of one key: exactly the bound reaches the
// pool, every other request gets 429 with Retry-After in the surface's
// shape, and the log names the principal, never the key.
func TestKeyLimitsExactUnderLoad(t *testing.T) {
	const n = 1000
	rows := []struct {
		name      string
		lim       config.APIKey
		path      string
		wantAdmit int
		wantAfter string
		anthropic bool
	}{
		{"max_concurrent 25", config.APIKey{MaxConcurrent: 25}, "/v1/chat/completions", 25, "1", false},
		{"requests_per_minute 40", config.APIKey{RequestsPerMinute: 40}, "/v1/chat/completions", 40, "2", false},
		{"max_concurrent 7 on /v1/messages", config.APIKey{MaxConcurrent: 7}, "/v1/messages", 7, "1", true},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			r := newLimitRig(t, func(c *config.Config) {
				c.APIKeys[0].MaxConcurrent = row.lim.MaxConcurrent
				c.APIKeys[0].RequestsPerMinute = row.lim.RequestsPerMinute
			})
			tr := &http.Transport{MaxIdleConnsPerHost: n}
			t.Cleanup(tr.CloseIdleConnections)
			client := &http.Client{Transport: tr}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type answer struct {
				status int
				after  string
				body   string
				err    error
			}
			answers := make(chan answer, n)
			for range n {
				go func() {
					resp, body, err := r.post(ctx, client, row.path, "sk-secret-a")
					if err != nil {
						answers <- answer{err: err}
						return
					}
					answers <- answer{status: resp.StatusCode, after: resp.Header.Get("Retry-After"), body: body}
				}()
			}
			// Every refusal comes back while the admitted requests wait in
			// the pool (or, for the rate, went through it).
			close429 := n - row.wantAdmit
			if row.lim.MaxConcurrent == 0 {
				close(r.p.release) // the rate row: admitted requests answer at once
			}
			got := map[int]int{}
			// The burst needs seconds of CPU under the race detector; on a
			// loaded machine it gets little of it. Only a stop in progress
			// is a failure: each answer (or pool entry) has its own wait.
			stuck := time.NewTimer(progressWait)
			defer stuck.Stop()
			for i := range n {
				if i == close429 && row.lim.MaxConcurrent > 0 {
					for j := range row.wantAdmit {
						select {
						case <-r.p.in:
							stuck.Reset(progressWait)
						case <-stuck.C:
							t.Fatalf("%d requests reached the pool, want %d (none more for %v)", j, row.wantAdmit, progressWait)
						}
					}
					close(r.p.release)
				}
				select {
				case a := <-answers:
					stuck.Reset(progressWait)
					if a.err != nil {
						t.Fatal(a.err)
					}
					got[a.status]++
					if a.status == 429 {
						if a.after != row.wantAfter {
							t.Fatalf("Retry-After: got %q, want %q", a.after, row.wantAfter)
						}
						e := checkShape(t, a.body, row.anthropic)
						if !strings.Contains(e.Error.Message, "for this API key") {
							t.Fatalf("429 message: %s", a.body)
						}
					}
				case <-stuck.C:
					t.Fatalf("%d of %d answers, none more for %v; so far %v", i, n, progressWait, got)
				}
			}
			if got[429] != close429 || got[404] != row.wantAdmit || int(r.p.entered.Load()) != row.wantAdmit {
				t.Fatalf("got statuses %v and %d pool entries, want %d×429 and %d×404", got, r.p.entered.Load(), close429, row.wantAdmit)
			}
			if ks, _ := r.h.keys.StatusOf("team-a", fixedNow()); ks.InFlight != 0 {
				t.Errorf("in flight after every answer: %d", ks.InFlight)
			}
			logs := r.log.String()
			if !strings.Contains(logs, "principal=team-a") || strings.Contains(logs, "sk-secret-a") {
				t.Errorf("want the principal and never the key in the log:\n%s", logs)
			}
			if lines := strings.Count(logs, "API key limit"); lines > 20 {
				t.Errorf("%d refusal lines for one burst; want them rate limited", lines)
			}
		})
	}
}

// B2: http.max_inflight_body_bytes and http.max_connections answer
// at once with 503 and Retry-After in the surface's shape, and every
// counted byte and connection is given back.
func TestGlobalLimits(t *testing.T) {
	head := func(path string, length int) string {
		return "POST " + path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-secret-a\r\n" +
			"Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(length) + "\r\n\r\n"
	}
	part := strings.Repeat("x", 20<<10)
	rows := []struct {
		name      string
		mutate    func(*config.Config)
		hold      int    // connections holding a 20 KiB partial body
		path      string // of the refused request
		anthropic bool
		wantCode  string
	}{
		// Each held body grew to 32 KiB: two fit in 64 KiB, the third's
		// first 4 KiB do not.
		{"in-flight body bytes", func(c *config.Config) { c.HTTP.MaxInflightBodyBytes = 64 << 10 }, 2,
			"/v1/chat/completions", false, "server_overloaded"},
		{"connections", func(c *config.Config) { c.HTTP.MaxConnections = 3 }, 3,
			"/v1/chat/completions", false, "too_many_connections"},
		{"connections, Anthropic shape", func(c *config.Config) { c.HTTP.MaxConnections = 2 }, 2,
			"/v1/messages", true, ""},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			cfgHolder := func(c *config.Config) { row.mutate(c) }
			r := newLimitRigListener(t, cfgHolder, len(head("/v1/chat/completions", 1<<20))+len(part))
			for range row.hold {
				holdConn(t, r.addr, r.wl, head("/v1/chat/completions", 1<<20), part)
			}
			c, err := net.Dial("tcp", r.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(waitFor))
			if _, err := io.WriteString(c, head(row.path, len(chatBody))+chatBody); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" {
				t.Fatalf("got %d Retry-After %q, want 503 and 1; body %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
			}
			e := checkShape(t, string(body), row.anthropic)
			if !row.anthropic && (e.Error.Code == nil || *e.Error.Code != row.wantCode) {
				t.Fatalf("code: got %v, want %q", e.Error.Code, row.wantCode)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("the refused connection stays open: %v", err)
			}
			if r.p.entered.Load() != 0 {
				t.Errorf("%d requests reached the pool", r.p.entered.Load())
			}
			r.srv.CloseClientConnections()
			r.srv.Close()
			if used := r.h.lim.bodies.Used(); used != 0 {
				t.Errorf("body bytes still counted after every connection closed: %d", used)
			}
			if n, over := r.h.lim.conns.open(); n != 0 || over != 0 {
				t.Errorf("connections still counted after every connection closed: %d (%d over the bound)", n, over)
			}
		})
	}
}

// limitRigListener is a limitRig whose listener reports when a connection's
// handler has read want bytes and waits for more.
type limitRigListener struct {
	*limitRig
	wl *waitingListener
}

func newLimitRigListener(t *testing.T, mutate func(*config.Config), want int) *limitRigListener {
	t.Helper()
	cfg := testConfig(map[string]string{"team-a": "sk-secret-a"})
	cfg.HTTP.MaxBodyBytes = 1 << 20
	mutate(cfg)
	r := &limitRig{p: &heldPool{in: make(chan struct{}, 1000), release: make(chan struct{})}, log: &proctest.Log{}}
	r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: newFakeDispatcher(newFakeStream("run-1")),
		Now: fixedNow, NewID: seqIDs(), Logger: slog.New(slog.NewTextHandler(r.log, nil))})
	r.srv = httptest.NewUnstartedServer(r.h)
	wl := &waitingListener{Listener: r.srv.Listener, want: want, waiting: make(chan struct{}, 64)}
	r.srv.Listener = wl
	r.srv.Config.ConnContext = r.h.ConnContext
	r.srv.Config.ConnState = r.h.ConnState
	r.srv.Start()
	r.addr = wl.Addr().String()
	t.Cleanup(r.srv.Close)
	t.Cleanup(func() { close(r.p.release) })
	return &limitRigListener{limitRig: r, wl: wl}
}
