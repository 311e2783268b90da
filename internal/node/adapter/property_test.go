package adapter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// scenario is one random upstream behaviour.
type scenario struct {
	Status      int
	ContentType string
	Body        []byte
	Chunks      []int // sizes of the flushed writes; they sum to len(Body) or to Cut
	Cut         int   // reset after this many body bytes; -1 = no reset
	Length      bool  // send Content-Length instead of chunked encoding
}

func randomScenario(r *rand.Rand) scenario {
	sc := scenario{Cut: -1}
	sc.Status = []int{200, 200, 200, 201, 400, 404, 429, 500, 503}[r.IntN(9)]
	sc.ContentType = []string{"text/event-stream", "application/json", "application/octet-stream", "application/x-ndjson", ""}[r.IntN(5)]
	switch r.IntN(3) {
	case 0: // random bytes, any length up to 80 KiB
		sc.Body = make([]byte, r.IntN(80<<10))
		for i := range sc.Body {
			sc.Body[i] = byte(r.Uint32())
		}
	case 1: // an SSE chat stream, sometimes with a usage chunk
		var b bytes.Buffer
		for i := r.IntN(200); i > 0; i-- {
			fmt.Fprintf(&b, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", strconv.Itoa(r.IntN(1e6)))
		}
		if r.IntN(2) == 0 {
			b.WriteString(`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}` + "\n\n")
		}
		b.WriteString("data: [DONE]\n\n")
		sc.Body = b.Bytes()
	default: // empty
	}
	end := len(sc.Body)
	if r.IntN(4) == 0 {
		sc.Cut = r.IntN(len(sc.Body) + 1)
		end = sc.Cut
	} else if r.IntN(5) == 0 {
		sc.Length = true
	}
	for n := 0; n < end; {
		c := 1 + r.IntN(min(end-n, []int{8, 200, 40 << 10}[r.IntN(3)]))
		sc.Chunks = append(sc.Chunks, c)
		n += c
	}
	return sc
}

func (sc scenario) serve(w http.ResponseWriter) {
	if sc.ContentType != "" {
		w.Header().Set("Content-Type", sc.ContentType)
	}
	if sc.Length {
		w.Header().Set("Content-Length", strconv.Itoa(len(sc.Body)))
	}
	w.WriteHeader(sc.Status)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	off := 0
	for _, c := range sc.Chunks {
		if _, err := w.Write(sc.Body[off : off+c]); err != nil {
			return
		}
		_ = rc.Flush()
		off += c
	}
	if sc.Cut >= 0 {
		if conn, _, err := rc.Hijack(); err == nil {
			conn.Close()
		}
	}
}

// T2 property: whatever the upstream does (random statuses, content types,
// bodies, chunking, resets), one tunnel's frames are RESPONSE_START?
// (BODY|USAGE)* (END|ERROR) with seq rising, and the BODY bytes are exactly
// the bytes the upstream sent: all of them and END without a reset, the sent
// prefix and ERROR with one.
func TestTunnelPropertyRandomUpstream(t *testing.T) {
	leakcheck.Check(t)
	seed := uint64(time.Now().UnixNano())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d", seed)
		}
	})
	r := rand.New(rand.NewPCG(seed, 0x10b))
	scenarios := make([]scenario, 60)
	for i := range scenarios {
		scenarios[i] = randomScenario(r)
	}
	up := newFake(t, func(w http.ResponseWriter, _ *http.Request, body []byte) {
		var req struct{ Scenario int }
		if json.Unmarshal(body, &req) != nil || req.Scenario < 0 || req.Scenario >= len(scenarios) {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		scenarios[req.Scenario].serve(w)
	})
	s := newSet(t, adapter.Options{}, compatAdapter("llama", llamaProfile(up.URL), 1))
	for i, sc := range scenarios {
		frs := tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny",
			Operation: protocol.OpChatCompletions, Body: []byte(fmt.Sprintf(`{"scenario":%d}`, i))})
		last, status, body, _ := checkTunnel(t, frs)
		desc := fmt.Sprintf("scenario %d (status %d, %q, %d bytes, %d writes, cut %d, length %v)",
			i, sc.Status, sc.ContentType, len(sc.Body), len(sc.Chunks), sc.Cut, sc.Length)
		if status != int32(sc.Status) {
			t.Fatalf("%s: RESPONSE_START status %d", desc, status)
		}
		want, kind := sc.Body, iop.TunnelFrameKind_TUNNEL_FRAME_END
		if sc.Cut >= 0 {
			want, kind = sc.Body[:sc.Cut], iop.TunnelFrameKind_TUNNEL_FRAME_ERROR
		}
		if last.GetKind() != kind {
			t.Fatalf("%s: terminal %v %q, want %v", desc, last.GetKind(), last.GetError(), kind)
		}
		if !bytes.Equal(body, want) {
			t.Fatalf("%s: relayed %d bytes, want exactly the %d the upstream sent", desc, len(body), len(want))
		}
	}
}
