package anthropic

import (
	"strconv"
	"strings"
	"testing"
)

// agentBody is a coding agent's Messages request: a system prompt in
// blocks, tools, and 20 turns of content-block arrays with tool round
// trips, as Claude Code sends them.
func agentBody() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"tiny","max_tokens":1024,"stream":true,"system":[{"type":"text","text":"You are a coding agent.","cache_control":{"type":"ephemeral"}}],` +
		`"tools":[{"name":"read","description":"read a file","input_schema":{"type":"object","properties":{"path":{"type":"string"}}}}],"messages":[`)
	for i := range 10 {
		id := "toolu_" + strconv.Itoa(i)
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":[{"type":"text","text":"step ` + strconv.Itoa(i) + `: please read the file and explain it"}]},` +
			`{"role":"assistant","content":[{"type":"text","text":"Reading."},{"type":"tool_use","id":"` + id + `","name":"read","input":{"path":"a.go"}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"` + id + `","content":[{"type":"text","text":"package main\nfunc main() {}"}]}]}`)
	}
	b.WriteString(`,{"role":"assistant","content":[{"type":"text","text":"Done."}]},{"role":"user","content":"thanks"}]}`)
	return []byte(b.String())
}

// BenchmarkInput: the run path's conversion of an agent's Messages request
// (allocations per request).
func BenchmarkInput(b *testing.B) {
	body := agentBody()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, e := Input(body, false); e != nil {
			b.Fatal(e)
		}
	}
}
