package adapter

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"testing"
)

// fakeBase stands in for net/http's Transport: each RoundTrip takes the
// next step, reports the connection it "took" through the request's
// httptrace GotConn, writes wrote bytes on it and then fails with err or
// answers 200. It records each request body it was given.
type fakeBase struct {
	steps  []fakeStep
	bodies []string
}

type fakeStep struct {
	wrote int    // bytes written on the connection before the failure
	err   error  // nil: a 200 answer
	conn  string // "" a tracked connection, "plain" an untracked one, "none" no GotConn (dial failed)
}

func (f *fakeBase) RoundTrip(req *http.Request) (*http.Response, error) {
	st := f.steps[len(f.bodies)]
	b := ""
	if req.Body != nil {
		raw, _ := io.ReadAll(req.Body)
		req.Body.Close()
		b = string(raw)
	}
	f.bodies = append(f.bodies, b)
	if st.conn != "none" {
		c1, c2 := net.Pipe()
		defer c1.Close()
		defer c2.Close()
		var c net.Conn = c1
		tc := &trackedConn{Conn: c1}
		tc.written.Store(100) // bytes of earlier requests on a reused connection
		if st.conn == "" {
			c = tc
		}
		httptrace.ContextClientTrace(req.Context()).GotConn(httptrace.GotConnInfo{Conn: c, Reused: true})
		tc.written.Add(int64(st.wrote))
	}
	if st.err != nil {
		return nil, st.err
	}
	return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}}, nil
}

func (f *fakeBase) CloseIdleConnections() {}

// H11, client.go "Resending": a request that failed without one byte
// of it written on its connection is sent again with its body rewound, at
// most maxUnwrittenResends times; one that wrote any byte, got no
// connection, ran on a connection the node does not track, or whose
// context ended, is not.
func TestCloseAwareResend(t *testing.T) {
	closedIdle := errors.New("http: server closed idle connection")
	reset := errors.New("read: connection reset by peer")
	fail0 := fakeStep{err: closedIdle}
	ok := fakeStep{}
	rows := []struct {
		name      string
		steps     []fakeStep
		cancelled bool
		wantCalls int
		wantErr   bool
	}{
		{"nothing written, then answered", []fakeStep{fail0, ok}, false, 2, false},
		{"part of the request written", []fakeStep{{wrote: 10, err: reset}, ok}, false, 1, true},
		{"all of it written, then reset", []fakeStep{{wrote: 300, err: reset}, ok}, false, 1, true},
		{"no connection (dial failed)", []fakeStep{{conn: "none", err: reset}, ok}, false, 1, true},
		{"untracked connection", []fakeStep{{conn: "plain", err: closedIdle}, ok}, false, 1, true},
		{"context ended", []fakeStep{fail0, ok}, true, 1, true},
		{"bounded", []fakeStep{fail0, fail0, fail0, fail0, ok}, false, 1 + maxUnwrittenResends, true},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			f := &fakeBase{steps: r.steps}
			tr := &closeAwareTransport{base: f}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if r.cancelled {
				cancel()
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://backend/v1/chat/completions", bytes.NewReader([]byte(`{"model":"tiny"}`)))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := tr.RoundTrip(req)
			if (err != nil) != r.wantErr {
				t.Fatalf("got error %v, want error %v", err, r.wantErr)
			}
			if resp != nil {
				resp.Body.Close()
			}
			if len(f.bodies) != r.wantCalls {
				t.Fatalf("sent %d times, want %d", len(f.bodies), r.wantCalls)
			}
			for i, b := range f.bodies {
				if b != `{"model":"tiny"}` {
					t.Errorf("send %d carried body %q, want the whole body", i+1, b)
				}
			}
		})
	}
}

// H11: closesAfter names exactly llama-server's chunked keep-alive
// answers (client.go, "Connections a backend closes without saying so").
func TestClosesAfter(t *testing.T) {
	rows := []struct {
		name   string
		server string
		te     []string
		close  bool
		proto  int
		want   bool
	}{
		{"llama-server streamed answer", "llama.cpp", []string{"chunked"}, false, 1, true},
		{"llama-server Content-Length answer", "llama.cpp", nil, false, 1, false},
		{"llama-server answer saying Connection: close", "llama.cpp", []string{"chunked"}, true, 1, false},
		{"another server's streamed answer", "uvicorn", []string{"chunked"}, false, 1, false},
		{"HTTP/2", "llama.cpp", nil, false, 2, false},
	}
	for _, r := range rows {
		resp := &http.Response{ProtoMajor: r.proto, TransferEncoding: r.te, Close: r.close, Header: http.Header{"Server": {r.server}}}
		if got := closesAfter(resp); got != r.want {
			t.Errorf("%s: got %v, want %v", r.name, got, r.want)
		}
	}
}
