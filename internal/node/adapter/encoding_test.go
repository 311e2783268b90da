package adapter_test

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// coder is one content coding as servers send it.
type coder struct {
	name, header string
	writer       func(io.Writer) interface {
		io.WriteCloser
		Flush() error
	}
}

var coders = []coder{
	{"gzip", "gzip", func(w io.Writer) interface {
		io.WriteCloser
		Flush() error
	} {
		return gzip.NewWriter(w)
	}},
	{"deflate zlib-wrapped", "deflate", func(w io.Writer) interface {
		io.WriteCloser
		Flush() error
	} {
		return zlib.NewWriter(w)
	}},
	{"deflate raw", "deflate", func(w io.Writer) interface {
		io.WriteCloser
		Flush() error
	} {
		fw, _ := flate.NewWriter(w, flate.DefaultCompression)
		return fw
	}},
}

// codedReplay answers body in coding c (although the request said
// Accept-Encoding: identity), flushing the coder and the connection after
// every SSE event or NDJSON line; before the last part it waits for gate
// (nil: no wait), so a test can prove the first parts were relayed before
// the rest was written.
func codedReplay(c coder, contentType string, body []byte, gate <-chan struct{}) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, r *http.Request, _ []byte) {
		if r.Header.Get("Accept-Encoding") != "identity" {
			http.Error(w, "the node did not ask for identity", http.StatusTeapot)
			return
		}
		w.Header().Set("Content-Type", contentType)
		w.Header().Set("Content-Encoding", c.header)
		rc := http.NewResponseController(w)
		cw := c.writer(w)
		parts := splitKeep(body)
		for i, part := range parts {
			if i == len(parts)-1 && i > 0 && gate != nil {
				select {
				case <-gate:
				case <-time.After(5 * time.Second):
					return // the node buffered; the test fails on the body it got
				}
			}
			if _, err := cw.Write(part); err != nil {
				return
			}
			_ = cw.Flush()
			_ = rc.Flush()
		}
		_ = cw.Close()
	}
}

// B3: an OpenAI-compatible server that compresses although asked for
// identity: the tunnel relays the decoded body without Content-Encoding or
// Content-Length (T2: a stream still leaves event by event; its usage is
// still observed), in gzip and in both kinds of deflate.
func TestTunnelDecodesCodedAnswers(t *testing.T) {
	stream := sample(t, "llama_v1_chat_stream.sse")
	plain := sample(t, "llama_v1_chat_nonstream.json")
	for _, c := range coders {
		for _, streamed := range []bool{false, true} {
			t.Run(fmt.Sprintf("B3 %s streamed=%v", c.name, streamed), func(t *testing.T) {
				leakcheck.Check(t)
				want, ctype := plain, "application/json"
				var gate chan struct{}
				if streamed {
					want, ctype, gate = stream, "text/event-stream", make(chan struct{})
				}
				first := splitKeep(want)[0]
				up := newFake(t, codedReplay(c, ctype, want, gate))
				s := newSet(t, adapter.Options{}, compatAdapter("llama", llamaProfile(up.URL), 1))
				var frs []*iop.ProviderTunnelFrame
				var got []byte
				s.Tunnel(context.Background(), "t", &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny", Operation: protocol.OpChatCompletions,
					Body: []byte(`{}`), Stream: streamed}, func(f *iop.ProviderTunnelFrame) {
					frs = append(frs, f)
					got = append(got, f.GetBody()...)
					if gate != nil && len(got) >= len(first) {
						select {
						case <-gate:
						default:
							close(gate)
						}
					}
				})
				last, status, body, usages := checkTunnel(t, frs)
				if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END || status != 200 || !bytes.Equal(body, want) {
					t.Fatalf("B3: %v %q status %d, body %q; want END 200 with the decoded body", last.GetKind(), last.GetError(), status, body)
				}
				for _, h := range frs[0].GetHeaders() {
					if strings.EqualFold(h.GetName(), "Content-Encoding") || strings.EqualFold(h.GetName(), "Content-Length") {
						t.Errorf("B3: %s: %s relayed with the decoded body", h.GetName(), h.GetValue())
					}
				}
				if len(usages) == 0 {
					t.Errorf("K: no usage observed in the decoded body")
				}
			})
		}
	}
}

// B3: a coding the node cannot decode, or a body that claims gzip and is
// not, ends the tunnel in ERROR upstream_error naming the coding, before any
// BODY byte (the edge can still answer a clean 502), whose client words
// (message) say which coding it was.
func TestTunnelRefusesUnreadableCodings(t *testing.T) {
	plain := sample(t, "llama_v1_chat_nonstream.json")
	cases := []struct{ name, encoding, want string }{
		{"B3 br", "br", `Content-Encoding "br"`},
		{"B3 zstd", "zstd", `Content-Encoding "zstd"`},
		{"B3 claims gzip, is JSON", "gzip", `not valid Content-Encoding "gzip"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			up := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Encoding", tc.encoding)
				_, _ = w.Write(plain)
			})
			s := newSet(t, adapter.Options{}, compatAdapter("llama", llamaProfile(up.URL), 1))
			frs := tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny", Operation: protocol.OpChatCompletions, Body: []byte(`{}`)})
			last, _, body, _ := checkTunnel(t, frs)
			if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_ERROR || last.GetFailureCode() != protocol.CodeUpstreamError.String() ||
				!strings.Contains(last.GetMessage(), tc.want) || !strings.Contains(last.GetError(), tc.want) || len(body) != 0 {
				t.Fatalf("B3: %v %q message %q error %q after %d body bytes; want ERROR upstream_error naming %s before any byte",
					last.GetKind(), last.GetFailureCode(), last.GetMessage(), last.GetError(), len(body), tc.want)
			}
		})
	}
}

// B3: the run path reads a coded NDJSON stream (Ollama's /api/chat) and a
// coded SSE stream (an OpenAI-compatible chat stream) decoded, delta by
// delta; an unreadable coding is ERROR upstream_error naming it.
func TestRunDecodesCodedStreams(t *testing.T) {
	ndjson := sample(t, "ollama_api_chat_stream.ndjson")
	sse := sample(t, "llama_v1_chat_stream.sse")
	for _, c := range coders {
		for _, compat := range []bool{false, true} {
			t.Run(fmt.Sprintf("B3 %s openai-compatible=%v", c.name, compat), func(t *testing.T) {
				leakcheck.Check(t)
				var up *fake
				var ac *iop.AdapterConfig
				if compat {
					up = newFake(t, codedReplay(c, "text/event-stream", sse, nil))
					ac = compatAdapter("llama", llamaProfile(up.URL), 1)
				} else {
					up = newFake(t, codedReplay(c, "application/x-ndjson", ndjson, nil))
					ac = ollamaAdapter("llama", up.URL, 1)
				}
				s := newSet(t, adapter.Options{}, ac)
				last, deltas := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Adapter: "llama", Stream: true, Target: "tiny", Input: userInput("Hi")}))
				if last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE || last.GetContent() != tinyReply || deltas != tinyReply || last.GetUsage() == nil {
					t.Fatalf("B3: %v %q content %q deltas %q usage %v; want COMPLETE %q", last.GetType(), last.GetError(), last.GetContent(), deltas, last.GetUsage(), tinyReply)
				}
			})
		}
	}
	for _, enc := range []string{"br", "gzip"} {
		t.Run("B3 unreadable "+enc, func(t *testing.T) {
			leakcheck.Check(t)
			up := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "application/x-ndjson")
				w.Header().Set("Content-Encoding", enc)
				_, _ = w.Write(ndjson)
			})
			s := newSet(t, adapter.Options{}, ollamaAdapter("llama", up.URL, 1))
			last, deltas := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Adapter: "llama", Stream: true, Target: "tiny", Input: userInput("Hi")}))
			if last.GetType() != iop.RunEventType_RUN_EVENT_ERROR || last.GetFailureCode() != protocol.CodeUpstreamError.String() ||
				!strings.Contains(last.GetMessage(), fmt.Sprintf("%q", enc)) || deltas != "" {
				t.Fatalf("B3: %v %q message %q deltas %q; want ERROR upstream_error naming %q", last.GetType(), last.GetFailureCode(), last.GetMessage(), deltas, enc)
			}
		})
	}
}

// B3: a decompression bomb on the run path meets the bound the same bytes
// would meet uncompressed: 9 MiB of content in 1 MiB NDJSON lines (a few KiB
// of gzip) fails with upstream_error at upstream.MaxResultBytes (8 MiB),
// and one line of 5 MiB at the NDJSON line cap (4 MiB).
func TestRunCodedBombHitsTheBodyBound(t *testing.T) {
	// gzip members in a row decode as one body (RFC 1952 §2.2): each MiB is
	// compressed once.
	member := func(b []byte) []byte {
		var buf bytes.Buffer
		gw := gzip.NewWriter(&buf)
		_, _ = gw.Write(b)
		_ = gw.Close()
		return buf.Bytes()
	}
	mib := member([]byte(strings.Repeat("a", 1<<20)))
	open, closeLine := member([]byte(`{"model":"tiny","message":{"role":"assistant","content":"`)), member([]byte(`"},"done":false}`+"\n"))
	line := slices.Concat(open, mib, closeLine)
	cases := []struct {
		name  string
		coded []byte
		want  string
	}{
		{"B3 9 MiB of content past MaxResultBytes", bytes.Repeat(line, 9), "exceeds"},
		{"B3 one 5 MiB line past the line cap", slices.Concat(open, bytes.Repeat(mib, 5), closeLine), "line too long"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			up := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "application/x-ndjson")
				w.Header().Set("Content-Encoding", "gzip")
				_, _ = w.Write(tc.coded)
			})
			s := newSet(t, adapter.Options{}, ollamaAdapter("llama", up.URL, 1))
			last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Adapter: "llama", Stream: true, Target: "tiny", Input: userInput("Hi")}))
			if last.GetType() != iop.RunEventType_RUN_EVENT_ERROR || last.GetFailureCode() != protocol.CodeUpstreamError.String() || !strings.Contains(last.GetError(), tc.want) {
				t.Fatalf("B3: %v %q %q; want ERROR upstream_error (%s)", last.GetType(), last.GetFailureCode(), last.GetError(), tc.want)
			}
			t.Logf("%d bytes of gzip", len(tc.coded))
		})
	}
}
