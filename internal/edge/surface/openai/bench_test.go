package openai

import (
	"testing"

	st "iop/internal/edge/surface/surfacetest"
)

// BenchmarkChunkEncode: one content delta encoded into a reused buffer; the
// target is 0 allocs per chunk.
func BenchmarkChunkEncode(b *testing.B) {
	var c Chat
	c.Init(ChatOptions{Model: "tiny", ID: "chatcmpl-x", Created: 1700000000, Stream: true, IncludeUsage: true,
		NewID: func() string { return "x" }})
	ev := st.Delta(2, " token")
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		out, _, _ := c.Event(buf[:0], ev)
		buf = out
	}
}
