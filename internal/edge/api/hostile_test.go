package api

import (
	"net"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
)

// waitingListener hands out connections that report, on waiting, when the
// server has read at least want bytes from them and asks for more: the
// handler has taken everything the client sent and waits for the rest.
type waitingListener struct {
	net.Listener
	want    int
	waiting chan struct{} // one send per connection
}

func (l *waitingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &waitingConn{Conn: c, l: l}, nil
}

type waitingConn struct {
	net.Conn
	l    *waitingListener
	read atomic.Int64
	once sync.Once
}

func (c *waitingConn) Read(p []byte) (int, error) {
	if c.read.Load() >= int64(c.l.want) {
		c.once.Do(func() { c.l.waiting <- struct{}{} })
	}
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// heapLive is the heap in use by live objects after a full collection, in
// bytes.
func heapLive() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// B1: memory follows the bytes a client sent, never what it
// declared. Each row opens conns connections that send a request head and
// the start of a body, then hold; once every handler waits for the rest,
// the live heap may have grown by at most maxGrowth.
func TestHostileBodiesHoldLittleMemory(t *testing.T) {
	const declared = 8 << 20
	rows := []struct {
		name      string
		conns     int
		head      string
		sent      string
		maxGrowth int64
	}{
		{"declared 8 MiB, one byte sent", 200,
			"Content-Length: " + strconv.Itoa(declared) + "\r\n", "{", 16 << 20},
		{"chunked, one byte sent", 200,
			"Transfer-Encoding: chunked\r\n", "1\r\n{\r\n", 16 << 20},
		{"declared 8 MiB, 40 KiB sent", 50,
			"Content-Length: " + strconv.Itoa(declared) + "\r\n", `{"model":"` + string(make40k()), 50 * 160 << 10},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			cfg := testConfig(map[string]string{"p": "k"})
			cfg.HTTP.MaxBodyBytes = declared
			fp := newFakePool(protocol.TypeOllama)
			st := newFakeStream("run-1")
			t.Cleanup(st.kill)
			h := New(Options{Config: func() *config.Config { return cfg }, Pool: fp, Dispatcher: newFakeDispatcher(st),
				Now: fixedNow, NewID: seqIDs()})
			head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n" +
				"Content-Type: application/json\r\n" + row.head + "\r\n"
			srv := httptest.NewUnstartedServer(h)
			wl := &waitingListener{Listener: srv.Listener, want: len(head) + len(row.sent), waiting: make(chan struct{}, row.conns)}
			srv.Listener = wl
			srv.Start()
			t.Cleanup(srv.Close)

			before := heapLive()
			conns := make([]net.Conn, 0, row.conns)
			t.Cleanup(func() {
				for _, c := range conns {
					c.Close()
				}
			})
			for range row.conns {
				c, err := net.Dial("tcp", srv.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
				if _, err := c.Write([]byte(head + row.sent)); err != nil {
					t.Fatal(err)
				}
			}
			deadline := time.After(2 * waitFor)
			for i := range row.conns {
				select {
				case <-wl.waiting:
				case <-deadline:
					t.Fatalf("%d of %d handlers wait for their bodies", i, row.conns)
				}
			}
			growth := heapLive() - before
			t.Logf("%d connections: live heap grew %d KiB (%d B per connection)", row.conns, growth>>10, growth/int64(row.conns))
			if growth > row.maxGrowth {
				t.Errorf("live heap grew %d bytes, want under %d", growth, row.maxGrowth)
			}
			if fp.acquired != 0 {
				t.Errorf("%d requests admitted with their bodies unread", fp.acquired)
			}
		})
	}
}

func make40k() []byte {
	b := make([]byte, 40<<10)
	for i := range b {
		b[i] = 'x'
	}
	return b
}
