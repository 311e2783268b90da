package h1_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter/h1"
)

// counted is an httptest server that counts the connections it accepted.
func counted(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	var conns atomic.Int32
	s := httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s, &conns
}

func do(t *testing.T, c *http.Client, method, url, body string) (int, string, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// T1, T2: answers framed every way HTTP/1.1 allows arrive whole, and a
// connection whose answer ended cleanly is reused; one that must not be
// (Connection: close, a body closed early) is not.
func TestFramingAndReuse(t *testing.T) {
	leakcheck.Check(t)
	s, conns := counted(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/length":
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "hello")
		case "/chunked":
			for _, p := range []string{"data: a\n\n", "data: b\n\n"} {
				io.WriteString(w, p)
				w.(http.Flusher).Flush()
			}
		case "/echo":
			w.Write(body)
		case "/close":
			w.Header().Set("Connection", "close")
			io.WriteString(w, "bye")
		case "/nocontent":
			w.WriteHeader(http.StatusNoContent)
		case "/hints":
			w.Header().Set("Link", "</x>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			io.WriteString(w, "after hints")
		}
	})
	tr := &h1.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	steps := []struct {
		name, method, path, body string
		status                   int
		want                     string
		conns                    int32 // accepted so far
	}{
		{"T2 Content-Length body", "GET", "/length", "", 200, "hello", 1},
		{"T2 chunked stream, same connection", "GET", "/chunked", "", 200, "data: a\n\ndata: b\n\n", 1},
		{"T1 request body sent whole", "POST", "/echo", `{"model":"m"}`, 200, `{"model":"m"}`, 1},
		{"T2 204 without body keeps the connection", "GET", "/nocontent", "", 204, "", 1},
		{"T2 103 Early Hints skipped", "GET", "/hints", "", 200, "after hints", 1},
		{"T2 Connection: close answered", "GET", "/close", "", 200, "bye", 1},
		{"T2 a closed connection is not reused", "GET", "/length", "", 200, "hello", 2},
		{"HEAD keeps the connection", "HEAD", "/length", "", 200, "", 2},
	}
	for _, st := range steps {
		status, body, _ := do(t, c, st.method, s.URL+st.path, st.body)
		if status != st.status || body != st.want || conns.Load() != st.conns {
			t.Fatalf("%s: status %d body %q after %d connections; want %d %q after %d",
				st.name, status, body, conns.Load(), st.status, st.want, st.conns)
		}
	}
	// A body closed before its end takes its connection with it.
	resp, err := c.Get(s.URL + "/chunked")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if status, _, _ := do(t, c, "GET", s.URL+"/length", ""); status != 200 || conns.Load() != 3 {
		t.Fatalf("after an early close: status %d, %d connections; want a new one (3)", status, conns.Load())
	}
}

// E5: cancelling the request while the backend has not answered returns at
// once with the context's cause, and the backend sees its connection close.
func TestCancelWhileWaitingForHeaders(t *testing.T) {
	leakcheck.Check(t)
	gone := make(chan struct{})
	entered := make(chan struct{})
	s, _ := counted(t, func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body) // net/http watches for the close only after the body
		close(entered)
		<-r.Context().Done()
		close(gone)
	})
	tr := &h1.Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancelCause(context.Background())
	why := errors.New("client disconnected")
	req, _ := http.NewRequestWithContext(ctx, "POST", s.URL+"/v1/chat/completions", strings.NewReader("{}"))
	errc := make(chan error, 1)
	go func() {
		_, err := tr.RoundTrip(req)
		errc <- err
	}()
	<-entered
	cancel(why)
	if err := <-errc; !errors.Is(err, why) {
		t.Fatalf("RoundTrip = %v, want the cause %v", err, why)
	}
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the backend never saw the request end")
	}
}

// E5, H1: cancelling during a stream ends the body's Read with the cause,
// and the connection is not reused.
func TestCancelDuringBody(t *testing.T) {
	leakcheck.Check(t)
	release := make(chan struct{})
	s, conns := counted(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ok" {
			io.WriteString(w, "ok")
			return
		}
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	tr := &h1.Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/stream", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: first\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel()
	if _, err := io.ReadAll(br); !errors.Is(err, context.Canceled) {
		t.Fatalf("read after cancel = %v, want context.Canceled", err)
	}
	resp.Body.Close()
	if status, _, _ := do(t, &http.Client{Transport: tr}, "GET", s.URL+"/ok", ""); status != 200 || conns.Load() != 2 {
		t.Fatalf("next request: status %d, %d connections; want a new connection", status, conns.Load())
	}
}

// oneShot is a backend that answers one request per connection and then
// closes it without saying so (a keep-alive timeout racing the next
// request). closed gets a token after each close.
func oneShot(t *testing.T) (addr string, conns *atomic.Int32, closed <-chan struct{}) {
	conns = new(atomic.Int32)
	closes := make(chan struct{}, 16)
	addr = rawBackend(t, func(c net.Conn, br *bufio.Reader) {
		conns.Add(1)
		defer func() {
			c.Close()
			select {
			case closes <- struct{}{}:
			default:
			}
		}()
		if _, ok := readRequest(br); ok {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	return addr, conns, closes
}

// A reused connection the backend closed while idle fails before any byte
// of an answer. With probing off, the stale connection is used: a GET is
// sent again on a new connection; a POST is not (the backend might have
// read it: one chat completion must never become two generations) and
// fails with ErrConnClosed.
func TestStaleKeepAlive(t *testing.T) {
	leakcheck.Check(t)
	addr, conns, closed := oneShot(t)
	tr := &h1.Transport{ProbeAfter: -1}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	if status, body, _ := do(t, c, "POST", "http://"+addr+"/v1/chat/completions", `{"n":1}`); status != 200 || body != "ok" {
		t.Fatalf("first POST: %d %q", status, body)
	}
	<-closed
	if status, body, _ := do(t, c, "GET", "http://"+addr+"/v1/models", ""); status != 200 || body != "ok" || conns.Load() != 2 {
		t.Fatalf("GET on a stale connection: %d %q after %d connections; want a retry on a second one", status, body, conns.Load())
	}
	<-closed
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(`{"n":2}`))
	if _, err := tr.RoundTrip(req); !errors.Is(err, h1.ErrConnClosed) || conns.Load() != 2 {
		t.Fatalf("POST on a stale connection: %v after %d connections; want ErrConnClosed and no second send", err, conns.Load())
	}
}

// A connection idle past ProbeAfter (by default: any) is peeked before
// reuse: one the backend closed is dropped, so even a body that cannot be
// sent twice goes out once, on a new connection.
func TestIdleProbe(t *testing.T) {
	leakcheck.Check(t)
	addr, conns, closed := oneShot(t)
	tr := &h1.Transport{}
	defer tr.CloseIdleConnections()
	do(t, &http.Client{Transport: tr}, "GET", "http://"+addr+"/", "")
	<-closed // on loopback the FIN is in our socket once the peer's close returned
	req, _ := http.NewRequest("POST", "http://"+addr+"/", io.MultiReader(strings.NewReader("{}")))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v (the stale connection was used)", err)
	}
	resp.Body.Close()
	if conns.Load() != 2 {
		t.Fatalf("%d connections; want the stale one dropped and a new one dialed", conns.Load())
	}
}

// rawBackend accepts connections and hands each to serve with a reader.
func rawBackend(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				serve(c, bufio.NewReader(c))
			})
		}
	})
	return ln.Addr().String()
}

// readRequest reads one request and its body; false at the connection's end.
func readRequest(br *bufio.Reader) (*http.Request, bool) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, false
	}
	io.Copy(io.Discard, req.Body)
	return req, true
}

// A backend that misbehaves is refused with an error that says how, and its
// connection is never reused for the next request.
func TestMisbehavingBackend(t *testing.T) {
	leakcheck.Check(t)
	answer := func(head string) func(net.Conn, *bufio.Reader) {
		return func(c net.Conn, br *bufio.Reader) {
			if _, ok := readRequest(br); ok {
				io.WriteString(c, head)
			}
		}
	}
	big := "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", h1.MaxResponseHeaderBytes) + "\r\nContent-Length: 2\r\n\r\nok"
	for _, tc := range []struct{ name, head, want string }{
		{"headers over the cap", big, "response headers over"},
		{"101 nobody asked for", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n", "unexpected 101"},
		{"status below 100 (found by FuzzResponse)", "HTTP/1.1 000 Zero\r\nContent-Length: 0\r\n\r\n", "invalid status"},
		{"endless 1xx", strings.Repeat("HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n", 6) + "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "unexpected 103"},
	} {
		addr := rawBackend(t, answer(tc.head))
		tr := &h1.Transport{}
		req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
		if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
		tr.CloseIdleConnections()
	}
}

// Bytes a backend sends after its answer is complete are not read as the
// next request's answer: the connection is dropped at reuse.
func TestSurplusBytesNotReused(t *testing.T) {
	leakcheck.Check(t)
	sent := make(chan struct{}, 4)
	var first atomic.Bool
	addr := rawBackend(t, func(c net.Conn, br *bufio.Reader) {
		for {
			if _, ok := readRequest(br); !ok {
				return
			}
			if first.CompareAndSwap(false, true) {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL")
				sent <- struct{}{}
				continue
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ngood")
		}
	})
	tr := &h1.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	if _, body, _ := do(t, c, "GET", "http://"+addr+"/", ""); body != "hello" {
		t.Fatalf("first answer %q", body)
	}
	<-sent
	if _, body, _ := do(t, c, "GET", "http://"+addr+"/", ""); body != "good" {
		t.Fatalf("second answer %q: surplus bytes were read as the answer", body)
	}
}

// E5: a POST the backend read before it closed the connection is not sent
// again (the reviewer's case: two generations for one request).
func TestPostNotSentTwice(t *testing.T) {
	leakcheck.Check(t)
	var posts atomic.Int32
	addr := rawBackend(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, ok := readRequest(br)
			if !ok {
				return
			}
			if req.Method == http.MethodPost {
				posts.Add(1)
				return // read it, then died
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	tr := &h1.Transport{}
	defer tr.CloseIdleConnections()
	do(t, &http.Client{Transport: tr}, "GET", "http://"+addr+"/", "") // warm a connection
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", strings.NewReader("{}"))
	if _, err := tr.RoundTrip(req); err == nil {
		t.Fatal("POST to a backend that died reading it succeeded")
	}
	if n := posts.Load(); n != 1 {
		t.Fatalf("the backend read %d POSTs, want 1", n)
	}
}

type fallback struct{ got *http.Request }

func (f *fallback) RoundTrip(r *http.Request) (*http.Response, error) {
	f.got = r
	return nil, errors.New("fallback called")
}

// https and upgrades are not this transport's: they go to Fallback.
func TestFallback(t *testing.T) {
	leakcheck.Check(t)
	for _, tc := range []struct{ name, url, upgrade string }{
		{"https", "https://api.example.test/v1/models", ""},
		{"upgrade", "http://127.0.0.1:1/ws", "websocket"},
	} {
		fb := &fallback{}
		tr := &h1.Transport{Fallback: fb}
		req, _ := http.NewRequest("GET", tc.url, nil)
		if tc.upgrade != "" {
			req.Header.Set("Upgrade", tc.upgrade)
		}
		if _, err := tr.RoundTrip(req); err == nil || fb.got != req {
			t.Errorf("%s: not handed to the fallback (err %v)", tc.name, err)
		}
	}
	req, _ := http.NewRequest("GET", "https://api.example.test/", nil)
	if _, err := (&h1.Transport{}).RoundTrip(req); err == nil || !strings.Contains(err.Error(), "no fallback") {
		t.Errorf("https without a fallback: %v", err)
	}
}

// A dial failure names the address.
func TestDialError(t *testing.T) {
	leakcheck.Check(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = (&h1.Transport{}).RoundTrip(httptest.NewRequest("GET", "http://"+addr+"/", nil).WithContext(context.Background()))
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("dial to a closed port: %v", err)
	}
}
