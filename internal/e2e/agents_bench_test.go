package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

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
