package backend

import (
	"container/list"
	"encoding/json"
	"hash/maphash"
	"sync"
)

// prefixCache models an inference server's prompt cache (llama-server's KV
// cache and --cache-ram prompt cache, vLLM's automatic prefix caching): the
// instance remembers the prompts it processed, as hashes of the prompt at
// message boundaries, and a request whose prompt starts with one of them
// skips that part of the prefill. Options.PrefixCache bounds the
// boundaries held (least recently used evicted first); the cache is per
// Backend, so each demo instance is its own cache, as each real server is.
//
// A boundary's hash chains the model name, the preamble (Anthropic
// "system", "tools"), then each message's role and raw content JSON; the
// generated answer is stored as the next assistant message with the answer
// as a JSON string, so a client that sends it back in the next turn, as
// OpenAI and Ollama clients do, hits it. The cached token count is that
// boundary's prompt tokens by the package's estimate, at most prompt − 1:
// like llama-server, the last prompt token is always evaluated again.
type prefixCache struct {
	seed  maphash.Seed
	limit int

	mu  sync.Mutex
	lru *list.List               // of uint64, front = most recently used; guarded by mu
	idx map[uint64]*list.Element // guarded by mu
}

func newPrefixCache(limit int) *prefixCache {
	return &prefixCache{seed: maphash.MakeSeed(), limit: limit, lru: list.New(), idx: map[uint64]*list.Element{}}
}

// boundary is one prefix of a request's prompt: its hash and its prompt
// tokens (package estimate).
type boundary struct {
	hash   uint64
	tokens int
}

// boundaries returns the prefixes of q's prompt for model name, shortest
// first: the preamble, then one per message.
func (pc *prefixCache) boundaries(name string, q *chatRequest) []boundary {
	h := maphash.String(pc.seed, name)
	tokens := 16
	if len(q.System) > 0 && string(q.System) != "null" {
		h = pc.fold(h, q.System)
		tokens += 4 + (textLen(q.System)+3)/4
	}
	if q.hasTools() {
		h = pc.fold(h, q.Tools)
		tokens += (len(q.Tools) + 3) / 4
	}
	out := make([]boundary, 0, len(q.Messages)+1)
	out = append(out, boundary{h, tokens})
	for _, m := range q.Messages {
		h = pc.fold(pc.fold(h, m.Role), m.Content)
		tokens += 4 + (textLen(m.Content)+3)/4
		out = append(out, boundary{h, tokens})
	}
	return out
}

// answer returns the boundary after the assistant message carrying text,
// following last.
func (pc *prefixCache) answer(last boundary, text []byte) boundary {
	q, _ := json.Marshal(string(text))
	return boundary{pc.fold(pc.fold(last.hash, json.RawMessage(`"assistant"`)), q), last.tokens + 4 + (len(q)-2+3)/4}
}

func (pc *prefixCache) fold(h uint64, b []byte) uint64 {
	return (h*0x9e3779b97f4a7c15 ^ maphash.Bytes(pc.seed, b)) * 0xbf58476d1ce4e5b9
}

// use returns the prompt tokens of the longest cached prefix of bs, capped
// at prompt − 1, and then caches every boundary of bs.
func (pc *prefixCache) use(bs []boundary, prompt int) int {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	cached := 0
	for i := len(bs) - 1; i >= 0; i-- {
		if _, ok := pc.idx[bs[i].hash]; ok {
			cached = bs[i].tokens
			break
		}
	}
	for _, b := range bs {
		pc.store(b.hash)
	}
	return max(0, min(cached, prompt-1))
}

// add caches one boundary (an answer after its generation).
func (pc *prefixCache) add(b boundary) {
	pc.mu.Lock()
	pc.store(b.hash)
	pc.mu.Unlock()
}

func (pc *prefixCache) store(h uint64) {
	if e, ok := pc.idx[h]; ok {
		pc.lru.MoveToFront(e)
		return
	}
	if pc.lru.Len() >= pc.limit {
		old := pc.lru.Back()
		delete(pc.idx, old.Value.(uint64))
		pc.lru.Remove(old)
	}
	pc.idx[h] = pc.lru.PushFront(h)
}
