package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"

	"iop/internal/edge/surface"
	"iop/internal/edge/surface/anthropic"
	"iop/internal/edge/surface/responses"
	"iop/internal/node/adapter/ollama"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// BenchmarkAgentConversion measures the run path's conversion of a
// captured agent request (testdata/agents): the Edge's surface parse into
// a RunInput, its wire encoding and decoding, and the node's Ollama
// /api/chat body. The Claude Code turn is ~48 KB of system prompt, 12 tool
// schemas and history; the Codex turn ~39 KB with a tool namespace.
func BenchmarkAgentConversion(b *testing.B) {
	for _, c := range []struct {
		name, file string
		input      func([]byte) (*iop.RunInput, *surface.Error)
	}{
		{"claude-code", "claude-code/tool-result.json", func(body []byte) (*iop.RunInput, *surface.Error) {
			in, _, e := anthropic.InputPolicy(body, false, surface.ReportUnknown)
			return in, e
		}},
		{"codex", "codex/tool-result.json", func(body []byte) (*iop.RunInput, *surface.Error) {
			in, _, e := responses.InputPolicy(body, surface.ReportUnknown)
			return in, e
		}},
	} {
		raw, err := os.ReadFile(filepath.Join("testdata", "agents", c.file))
		if err != nil {
			b.Fatal(err)
		}
		var cp agentCapture
		if err := json.Unmarshal(raw, &cp); err != nil {
			b.Fatal(err)
		}
		body := withModel(b, cp.Body, "tiny")
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				in, e := c.input(body)
				if e != nil {
					b.Fatal(e)
				}
				wire, err := proto.Marshal(in)
				if err != nil {
					b.Fatal(err)
				}
				var got iop.RunInput
				if err := proto.Unmarshal(wire, &got); err != nil {
					b.Fatal(err)
				}
				if _, err := ollama.BuildChatRequest("tiny", &got); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAgentTurn: one captured agent turn (Claude Code's Messages turn
// with its tool result, Codex CLI's Responses turn; both streamed, as the
// agents send them) through the whole stack — client → Edge → node → demo
// backend (no token delay) and back — on the run path (group tiny, the
// Ollama adapter: the surface's conversion both ways) and on the tunnel
// (tiny-oa, llama-server's profile: the bytes as they are). p50-ms is the
// median turn; the run path's minus the tunnel's is what the conversion
// adds to an agent's turn.
func BenchmarkAgentTurn(b *testing.B) {
	leakcheck.Check(b)
	p := newPKI(b, "gpu-1")
	bp := startBackend(b, backend.Options{})
	url := bp.serve(b, nil)
	cfg := edgeConfig(b, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4), compatAdapter("oa", url, 4)}}},
		[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny")), modelGroup("tiny-oa", provider("gpu-1", "oa", "tiny"))}, nil)
	e := startEdge(b, cfg, nil, nil)
	startNode(b, p, "gpu-1", e.nodeAddr, nodeOpts{})
	newAdminClient(b, e).waitConnected(b, 10*time.Second, "gpu-1")
	c := newAPIClient(b, e)
	for _, a := range []string{"claude-code/tool-result.json", "codex/tool-result.json"} {
		raw, err := os.ReadFile(filepath.Join("testdata", "agents", a))
		if err != nil {
			b.Fatal(err)
		}
		var cp agentCapture
		if err := json.Unmarshal(raw, &cp); err != nil {
			b.Fatal(err)
		}
		for _, g := range []struct{ path, group string }{{"run", "tiny"}, {"tunnel", "tiny-oa"}} {
			body := withModel(b, cp.Body, g.group)
			b.Run(strings.Split(a, "/")[0]+"/"+g.path, func(b *testing.B) {
				var ds []time.Duration
				for b.Loop() {
					start := time.Now()
					resp, err := c.hc.Post(c.url+cp.Path, "application/json", bytes.NewReader(body))
					if err != nil {
						b.Fatal(err)
					}
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != http.StatusOK {
						b.Fatalf("status %d, read error %v", resp.StatusCode, err)
					}
					ds = append(ds, time.Since(start))
				}
				slices.Sort(ds)
				b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
			})
		}
	}
}
