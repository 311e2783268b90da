package surfacetest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"testing"

	"iop/internal/edge/surface"
	"iop/internal/protocol"

	iop "iop/proto/gen/iop"
)

// Script turns fuzz bytes into the run events a node might send for one
// stream (B1: peer input), for the encoders' fuzz targets. Opcodes:
// 0x01 START; 0x02 DELTA with the text up to the next 0x00; 0x04 the same
// with a log probability per byte of it (see logprob); 0x03 COMPLETE with that text as
// content, usage, meta as metadata["openai_tool_calls"] when set and the
// text tool-call fallback flag; 0x05 COMPLETE with one embedding whose
// values are the text's bytes read as little-endian float32 (NaN and ±Inf
// included). Other bytes are skipped; seq counts up from 1.
func Script(script []byte, meta string, fallback bool) []*iop.RunEvent {
	var evs []*iop.RunEvent
	text := func() string {
		i := bytes.IndexByte(script, 0)
		if i < 0 {
			i = len(script)
		}
		s := string(script[:i])
		script = script[min(i+1, len(script)):]
		return s
	}
	for seq := uint64(1); len(script) > 0; {
		op := script[0]
		script = script[1:]
		switch op {
		case 1:
			evs = append(evs, &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_START})
		case 2, 4:
			d := text()
			ev := &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_DELTA, Delta: d}
			if op == 4 {
				for i := range len(d) {
					ev.Logprobs = append(ev.Logprobs, &iop.TokenLogprob{Token: d[i : i+1], Logprob: logprob(d[i]), Bytes: []byte(d[i : i+1]),
						TopLogprobs: []*iop.TokenLogprob{{Token: "alt", Logprob: logprob(^d[i])}}})
				}
			}
			evs = append(evs, ev)
		case 3:
			ev := &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_COMPLETE, Content: text(), FinishReason: "stop",
				Usage: Usage(1, 2), Metadata: map[string]string{}}
			if meta != "" {
				ev.Metadata[protocol.MetaToolCalls] = meta
			}
			if fallback {
				ev.Metadata[protocol.MetaTextToolFallback] = "true"
				ev.FinishReason = "length"
			}
			evs = append(evs, ev)
		case 5:
			b := []byte(text())
			emb := &iop.Embedding{}
			for ; len(b) >= 4; b = b[4:] {
				emb.Values = append(emb.Values, math.Float32frombits(binary.LittleEndian.Uint32(b)))
			}
			evs = append(evs, &iop.RunEvent{Seq: seq, Type: iop.RunEventType_RUN_EVENT_COMPLETE, Usage: Usage(3, 0),
				Embeddings: []*iop.Embedding{emb}})
		default:
			continue
		}
		seq++
	}
	return evs
}

// logprob is the log probability a Script byte stands for: NaN for 0xff,
// -Inf for 0xfe, +Inf for 0xfd (none of which JSON can carry), else
// -b/10.
func logprob(b byte) float64 {
	switch b {
	case 0xff:
		return math.NaN()
	case 0xfe:
		return math.Inf(-1)
	case 0xfd:
		return math.Inf(1)
	}
	return -float64(b) / 10
}

// RunScript drives enc through evs as the HTTP layer does: until the
// terminal; an encoder error ends a stream with AppendError and a
// non-stream response with an HTTP error instead (httpErr, out then
// unused).
func RunScript(enc surface.Encoder, evs []*iop.RunEvent, stream bool) (out []byte, httpErr bool) {
	for _, ev := range evs {
		var done bool
		var e *surface.Error
		out, done, e = enc.Event(out, ev)
		if e != nil {
			if !stream {
				return nil, true
			}
			return enc.AppendError(out, e), false
		}
		if done {
			break
		}
	}
	return out, false
}

// CheckWellFormed fails t unless out is well formed for a client: one JSON
// document (or nothing) when not stream, else SSE events whose lines are
// "event: <name>" or "data: <JSON>" ("data: [DONE]" too).
func CheckWellFormed(t testing.TB, out []byte, stream bool) {
	t.Helper()
	if !stream {
		if len(out) > 0 && !json.Valid(out) {
			t.Fatalf("the body is not JSON: %q", out)
		}
		return
	}
	if len(out) > 0 && !bytes.HasSuffix(out, []byte("\n\n")) {
		t.Fatalf("the stream does not end with a whole event: %q", out)
	}
	for _, ev := range bytes.Split(out, []byte("\n\n")) {
		for _, line := range bytes.Split(ev, []byte("\n")) {
			switch {
			case len(line) == 0:
			case bytes.HasPrefix(line, []byte("event: ")):
			case bytes.HasPrefix(line, []byte("data: ")):
				data := line[len("data: "):]
				if string(data) != "[DONE]" && !json.Valid(data) {
					t.Fatalf("event data is not JSON: %q in %q", data, out)
				}
			default:
				t.Fatalf("malformed stream line %q in %q", line, out)
			}
		}
	}
}
