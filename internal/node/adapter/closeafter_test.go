package adapter_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// llamaConnServer answers as llama-server e95dae18 does on the wire
// (captured heads, samples/ bodies): a request with "stream":true gets a
// chunked text/event-stream answer whose head says "Keep-Alive: timeout=5,
// max=100", and then the server reads nothing more on that connection — it
// closes it (cpp-httplib leaves its keep-alive loop; client.go). The real
// server closes at once; this one waits until the client writes again
// (or the test ends) before it closes, the worst case of the same race made
// certain: a client that writes on the connection gets a reset and no
// answer. Other requests get a Content-Length answer and the connection
// stays open. late counts requests written on a connection after its
// streamed answer.
type llamaConnServer struct {
	rawConns
	stream, one []byte
	late        atomic.Int64
}

func startLlamaConnServer(t *testing.T) *llamaConnServer {
	t.Helper()
	s := &llamaConnServer{stream: sample(t, "llama_v1_chat_stream.sse"), one: sample(t, "llama_v1_chat_nonstream.json")}
	s.listen(t, s.serve)
	return s
}

func (s *llamaConnServer) serve(c net.Conn) {
	defer func() {
		c.(*net.TCPConn).SetLinger(0) // unread bytes at close: a reset, as the real server's close sends
		s.done(c)
	}()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			head := "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Type: application/json; charset=utf-8\r\n" +
				"Server: llama.cpp\r\nContent-Length: " + strconv.Itoa(len(s.one)) + "\r\nAccess-Control-Allow-Origin: \r\n\r\n"
			if _, err := c.Write(append([]byte(head), s.one...)); err != nil {
				return
			}
			continue
		}
		var b bytes.Buffer
		b.WriteString("HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Type: text/event-stream\r\n" +
			"Server: llama.cpp\r\nTransfer-Encoding: chunked\r\nAccess-Control-Allow-Origin: \r\n\r\n")
		for ev := range bytes.SplitAfterSeq(s.stream, []byte("\n\n")) { // one chunk per event, as llama-server writes them
			if len(ev) == 0 {
				continue
			}
			b.WriteString(strconv.FormatInt(int64(len(ev)), 16) + "\r\n")
			b.Write(ev)
			b.WriteString("\r\n")
		}
		b.WriteString("0\r\n\r\n")
		if _, err := c.Write(b.Bytes()); err != nil {
			return
		}
		if _, err := br.Peek(1); err == nil { // the client wrote on a connection the server is done with
			s.late.Add(1)
		}
		return
	}
}

// llama-server closes the connection after every streamed answer
// without saying so; the node never writes a request on such a connection
// (client.go), so requests sent one after the other — streamed tunnels,
// runs (streamed upstream) and Content-Length tunnels — all end well and
// none is written into a closing connection, while a connection that
// carried only Content-Length answers is reused.
func TestUpstreamClosesAfterStreamedAnswer(t *testing.T) {
	leakcheck.Check(t)
	srv := startLlamaConnServer(t)
	s := newSet(t, adapter.Options{}, compatAdapter("x", llamaProfile(srv.url()), 2))
	ctx := context.Background()
	tunnel := func(stream bool) (bool, string) {
		b := `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`
		if stream {
			b = `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		}
		last, _, _, _ := checkTunnel(t, tunnelAll(ctx, s, &iop.ProviderTunnelRequest{Adapter: "x", Target: "tiny",
			Operation: protocol.OpChatCompletions, Stream: stream, Body: []byte(b)}))
		return last.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_END, last.GetFailureCode() + " " + last.GetError()
	}
	run := func() (bool, string) {
		last, _ := checkRun(t, runAll(ctx, s, &iop.RunRequest{Adapter: "x", Target: "tiny", Input: userInput("hi")}))
		return last.GetType() == iop.RunEventType_RUN_EVENT_COMPLETE, last.GetFailureCode() + " " + last.GetError()
	}
	steps := []struct {
		name string
		do   func() (bool, string)
	}{
		{"streamed tunnel", func() (bool, string) { return tunnel(true) }},
		{"plain tunnel after a streamed one", func() (bool, string) { return tunnel(false) }},
		{"plain tunnel on a kept connection", func() (bool, string) { return tunnel(false) }},
		{"run on a kept connection", run},
		{"run after a run", run},
		{"streamed tunnel after a run", func() (bool, string) { return tunnel(true) }},
		{"plain tunnel after a streamed one", func() (bool, string) { return tunnel(false) }},
	}
	for _, st := range steps {
		if ok, why := st.do(); !ok {
			t.Fatalf("%s: %s", st.name, why)
		}
	}
	// Connections: 1 streamed tunnel; 2 plain, plain, run; 3 run; 4 streamed
	// tunnel; 5 plain.
	if n := srv.conns.Load(); n != 5 {
		t.Errorf("%d connections, want 5 (one per streamed answer, plus the kept one's successor)", n)
	}
	if n := srv.late.Load(); n != 0 {
		t.Errorf("%d requests were written on a connection after its streamed answer, want 0", n)
	}
}

// The connection's reset reaches the client even when the server has not
// closed yet (the fake waits for the write): a request written there fails
// with upstream_reset. This is the failure the rule above prevents; it
// checks that the fake can show it (a test that cannot fail proves
// nothing), with a client that does not know the rule.
func TestLlamaConnServerShowsTheRace(t *testing.T) {
	leakcheck.Check(t)
	srv := startLlamaConnServer(t)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	post := func(body string) error {
		req, _ := http.NewRequest(http.MethodPost, srv.url()+"/v1/chat/completions", bytes.NewReader([]byte(body)))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	if err := post(`{"stream":true}`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- post(`{}`) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a request written after a streamed answer was answered; the fake no longer shows llama-server's close")
		}
	case <-time.After(time.Minute):
		t.Fatal("no answer and no error within a minute")
	}
	if srv.late.Load() != 1 {
		t.Errorf("late %d, want 1", srv.late.Load())
	}
}
