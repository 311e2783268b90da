package api

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"iop/internal/edge/routing"
)

// conversation renders a chat body: a system prompt, then turns user /
// assistant messages, ending with a user message.
func conversation(system string, conv, turns int, extra string) string {
	var b strings.Builder
	b.WriteString(`{"model":"tiny",` + extra + `"messages":[`)
	if system != "" {
		fmt.Fprintf(&b, `{"role":"system","content":%q},`, system)
	}
	for t := range turns {
		fmt.Fprintf(&b, `{"role":"user","content":"conversation %d question %d"},`, conv, t)
		fmt.Fprintf(&b, `{"role":"assistant","content":"answer %d"},`, t)
	}
	fmt.Fprintf(&b, `{"role":"user","content":"conversation %d question %d"}]}`, conv, turns)
	return b.String()
}

// TestPrefixOf: R1 — the conversation prefix the HTTP layer hands
// the pool: later turns extend earlier ones, the conversation key is
// stable, the preamble seeds the chain without being a boundary, and only
// endpoints that carry a conversation have one.
func TestPrefixOf(t *testing.T) {
	hs := routing.NewHasher()
	prefix := func(ep *endpoint, body string) []uint64 {
		var hd head
		if e := parseHead([]byte(body), ep, &hd); e != nil {
			t.Fatalf("parseHead(%s): %v", body, e)
		}
		return prefixOf(hs, []byte(body), ep, hd.model, nil)
	}
	const sys = "You are a helpful assistant."
	rows := []struct {
		name     string
		ep       *endpoint
		a, b     string
		wantA    int  // boundaries of a
		shared   int  // leading boundaries a and b share
		sameFull bool // b's whole prefix equals a's
	}{
		{name: "issue16 chat: turn 3 extends turn 1 (system prompt is preamble, not a boundary)", ep: &epChat,
			a: conversation(sys, 1, 0, ""), b: conversation(sys, 1, 2, ""), wantA: 1, shared: 1},
		{name: "issue16 chat: another conversation shares nothing", ep: &epChat,
			a: conversation(sys, 1, 1, ""), b: conversation(sys, 2, 1, ""), wantA: 3, shared: 0},
		{name: "issue16 chat: another system prompt changes every boundary", ep: &epChat,
			a: conversation(sys, 1, 1, ""), b: conversation("Be terse.", 1, 1, ""), wantA: 3, shared: 0},
		{name: "issue16 chat: tools are preamble; other tools, other prefix", ep: &epChat,
			a: conversation(sys, 1, 1, `"tools":[{"type":"function","function":{"name":"a"}}],`),
			b: conversation(sys, 1, 1, `"tools":[{"type":"function","function":{"name":"b"}}],`), wantA: 3, shared: 0},
		{name: "issue16 chat: top-level member order and spacing do not matter", ep: &epChat,
			a: `{"model":"tiny","messages":[{"role":"user","content":"x"}],"stream":true}`,
			b: `{ "stream" : false , "messages" : [ {"role":"user","content":"x"} ] , "model" : "tiny" }`, wantA: 1, shared: 1, sameFull: true},
		{name: "issue16 chat: another model never aliases", ep: &epChat,
			a: `{"model":"tiny","messages":[{"role":"user","content":"x"}]}`,
			b: `{"model":"other","messages":[{"role":"user","content":"x"}]}`, wantA: 1, shared: 0},
		{name: "issue16 chat: developer messages are preamble too", ep: &epChat,
			a: `{"model":"tiny","messages":[{"role":"developer","content":"d"},{"role":"user","content":"x"}]}`,
			b: `{"model":"tiny","messages":[{"role":"developer","content":"d"},{"role":"user","content":"x"},{"role":"assistant","content":"y"}]}`, wantA: 1, shared: 1},
		{name: "issue16 messages: system is preamble, every message a boundary", ep: &epMessages,
			a: `{"model":"tiny","system":"s","messages":[{"role":"user","content":"x"}]}`,
			b: `{"model":"tiny","system":"s","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"},{"role":"user","content":"z"}]}`, wantA: 1, shared: 1},
		{name: "issue16 messages: another system prompt, another prefix", ep: &epMessages,
			a: `{"model":"tiny","system":"s","messages":[{"role":"user","content":"x"}]}`,
			b: `{"model":"tiny","system":"t","messages":[{"role":"user","content":"x"}]}`, wantA: 1, shared: 0},
		{name: "issue16 responses: input string is one boundary; instructions are preamble", ep: &epResponses,
			a: `{"model":"tiny","instructions":"i","input":"hello"}`,
			b: `{"model":"tiny","instructions":"j","input":"hello"}`, wantA: 1, shared: 0},
		{name: "issue16 responses: input items extend", ep: &epResponses,
			a: `{"model":"tiny","input":[{"role":"developer","content":"d"},{"role":"user","content":"x"}]}`,
			b: `{"model":"tiny","input":[{"role":"developer","content":"d"},{"role":"user","content":"x"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"1"}]}`, wantA: 1, shared: 1},
		{name: "issue16 responses: previous_response_id carries no conversation", ep: &epResponses,
			a: `{"model":"tiny","previous_response_id":"resp_1","input":"more"}`, b: `{"model":"tiny","input":"more"}`, wantA: 0, shared: 0},
		{name: "issue16 count_tokens carries no conversation", ep: &epCountTokens,
			a: `{"model":"tiny","messages":[{"role":"user","content":"x"}]}`, b: `{"model":"tiny","messages":[]}`, wantA: 0, shared: 0},
		{name: "issue16 chat: an empty message list carries no conversation", ep: &epChat,
			a: `{"model":"tiny","messages":[]}`, b: `{"model":"tiny","messages":[{"role":"system","content":"s"}]}`, wantA: 0, shared: 0},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			pa, pb := prefix(r.ep, r.a), prefix(r.ep, r.b)
			if len(pa) != r.wantA {
				t.Fatalf("a has %d boundaries, want %d", len(pa), r.wantA)
			}
			shared := 0
			for shared < min(len(pa), len(pb)) && pa[shared] == pb[shared] {
				shared++
			}
			if shared != r.shared {
				t.Fatalf("a and b share %d leading boundaries, want %d\na %x\nb %x", shared, r.shared, pa, pb)
			}
			if r.sameFull && !slices.Equal(pa, pb) {
				t.Fatalf("prefixes differ: %x vs %x", pa, pb)
			}
			if again := prefix(r.ep, r.a); !slices.Equal(again, pa) {
				t.Fatalf("not deterministic: %x then %x", pa, again)
			}
		})
	}
	t.Run("issue16 a long conversation is cut at maxPrefixBoundaries", func(t *testing.T) {
		if n := len(prefix(&epChat, conversation(sys, 1, maxPrefixBoundaries, ""))); n != maxPrefixBoundaries {
			t.Fatalf("%d boundaries, want %d", n, maxPrefixBoundaries)
		}
	})
}

// BenchmarkPrefixOf: the prefix of a chat request on its fifth turn, a
// 1.5 KB system prompt and ten ~300-byte messages (what a prefix_affinity
// request costs the HTTP layer on top of parseHead).
func BenchmarkPrefixOf(b *testing.B) {
	hs := routing.NewHasher()
	body := []byte(conversation(strings.Repeat("policy text ", 128), 3, 4,
		`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],`))
	body = []byte(strings.ReplaceAll(string(body), `question`, strings.Repeat("question ", 30)))
	var hd head
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		hd.prefix = prefixOf(hs, body, &epChat, "tiny", hd.prefixBuf[:0])
	}
	if len(hd.prefix) != 9 {
		b.Fatalf("%d boundaries, want 9", len(hd.prefix))
	}
}
