package adapter_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// input 1, against a real llama-server (IOP_TEST_OPENAI_URL;
// llama-server closes a keep-alive connection idle for 5 s): bursts of 20
// concurrent requests, half of them streamed, with gaps around those 5 s —
// the moment a pooled connection is reused while the server closes it.
// With the llamacpp profile's idle lifetime (3 s, what the edge sends) no
// request may fail. IOP_TEST_RACE_IDLE_MS
// overrides the lifetime (e.g. 60000 to see the race the lifetime removes;
// the failures are then logged, not asserted). The gaps are the scenario's
// idle time, not waits for an event.
func TestRealKeepAliveRace(t *testing.T) {
	base := realURL(t, "IOP_TEST_OPENAI_URL")
	leakcheck.Check(t)
	target := envOr("IOP_TEST_OPENAI_TARGET", "tiny")
	idle := int64(3000)
	control := false
	if v := os.Getenv("IOP_TEST_RACE_IDLE_MS"); v != "" {
		fmt.Sscan(v, &idle)
		control = true
	}
	gaps := []time.Duration{4900 * time.Millisecond, 5000 * time.Millisecond, 5050 * time.Millisecond, 5100 * time.Millisecond, 5200 * time.Millisecond}
	t.Run("idle lifetime", func(t *testing.T) {
		ac := compatAdapter("llama", llamaProfile(base), 32)
		ac.UpstreamIdleTimeoutMs = idle
		s := newSet(t, adapter.Options{}, ac)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		failed, total := 0, 0
		codes := map[string]int{}
		for b := 0; b <= len(gaps); b++ {
			if b > 0 {
				<-time.After(gaps[b-1]) // the scenario's idle gap
			}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ok, code := realOne(ctx, s, target, i%2 == 0)
					mu.Lock()
					defer mu.Unlock()
					total++
					if !ok {
						failed++
						codes[code]++
					}
				}()
			}
			wg.Wait()
		}
		t.Logf("idle lifetime %d ms: %d of %d requests failed %v", idle, failed, total, codes)
		if failed > 0 && !control {
			t.Errorf("%d of %d requests failed (%v) with the idle lifetime below the server's", failed, total, codes)
		}
	})
}

// realOne runs one chat on the tunnel (streamed) or the run path and
// reports whether it ended well, else its failure code.
func realOne(ctx context.Context, s *adapter.Set, target string, stream bool) (bool, string) {
	if stream {
		var last *iop.ProviderTunnelFrame
		s.Tunnel(ctx, "t", &iop.ProviderTunnelRequest{Adapter: "llama", Target: target, Operation: protocol.OpChatCompletions,
			Stream: true, Body: []byte(`{"model":"` + target + `","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)},
			func(f *iop.ProviderTunnelFrame) { last = f })
		return last.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_END, last.GetFailureCode()
	}
	var last *iop.RunEvent
	s.Run(ctx, "r", &iop.RunRequest{Adapter: "llama", Target: target, Input: userInput("hi")},
		func(ev *iop.RunEvent) { last = ev })
	return last.GetType() == iop.RunEventType_RUN_EVENT_COMPLETE, last.GetFailureCode()
}

// against a real llama-server (IOP_TEST_OPENAI_URL): llama-server
// closes the connection right after every streamed (chunked) answer, though
// the answer's head says "Keep-Alive: timeout=5, max=100" (cpp-httplib
// leaves its keep-alive loop when llama-server's chunked content provider
// returns false after the last chunk; client.go). First the fact, on a raw
// connection: a second request written after a streamed answer gets no
// answer. Then the node: requests sent one after the other, each right
// after a streamed answer ended — the instant the answer's connection is
// back in the pool and the server is closing it — all end well (the node
// never writes on such a connection).
func TestRealStreamedAnswerCloses(t *testing.T) {
	base := realURL(t, "IOP_TEST_OPENAI_URL")
	leakcheck.Check(t)
	target := envOr("IOP_TEST_OPENAI_TARGET", "tiny")
	t.Run("raw connection", func(t *testing.T) {
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Minute))
		br := bufio.NewReader(c)
		chat := func(stream bool) string {
			b := `{"model":"` + target + `","max_tokens":4,"stream":` + strconv.FormatBool(stream) + `,"messages":[{"role":"user","content":"hi"}]}`
			return "POST /v1/chat/completions HTTP/1.1\r\nHost: " + u.Host + "\r\nContent-Type: application/json\r\nContent-Length: " +
				strconv.Itoa(len(b)) + "\r\n\r\n" + b
		}
		io.WriteString(c, chat(true))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Close || resp.Header.Get("Server") != "llama.cpp" || len(resp.TransferEncoding) == 0 {
			t.Fatalf("streamed answer: Close %v Server %q Transfer-Encoding %v, want a chunked keep-alive answer from llama.cpp",
				resp.Close, resp.Header.Get("Server"), resp.TransferEncoding)
		}
		io.WriteString(c, chat(false))
		if resp, err := http.ReadResponse(br, nil); err == nil {
			resp.Body.Close()
			t.Fatalf("a request after a streamed answer got %s; llama-server no longer closes there (update client.go's rule)", resp.Status)
		}
	})
	t.Run("node", func(t *testing.T) {
		ac := compatAdapter("llama", llamaProfile(base), 4)
		ac.UpstreamIdleTimeoutMs = 3000
		s := newSet(t, adapter.Options{}, ac)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		failed := map[string]int{}
		const n = 60
		for i := range n {
			ok, code := false, ""
			switch i % 3 {
			case 0, 1: // a streamed tunnel; a run (streamed upstream)
				ok, code = realOne(ctx, s, target, i%3 == 0)
			case 2: // a tunnel answered with Content-Length (a connection the server keeps)
				var last *iop.ProviderTunnelFrame
				s.Tunnel(ctx, "t", &iop.ProviderTunnelRequest{Adapter: "llama", Target: target, Operation: protocol.OpChatCompletions,
					Body: []byte(`{"model":"` + target + `","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)},
					func(f *iop.ProviderTunnelFrame) { last = f })
				ok, code = last.GetKind() == iop.TunnelFrameKind_TUNNEL_FRAME_END, last.GetFailureCode()
			}
			if !ok {
				failed[code]++
			}
		}
		t.Logf("%d requests one after the other, two in three streamed: failures %v", n, failed)
		if len(failed) > 0 {
			t.Errorf("requests after a streamed answer failed: %v", failed)
		}
	})
}
