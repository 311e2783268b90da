package api

import (
	"iop/internal/edge/routing"
	"iop/internal/jsonscan"
)

// maxPrefixBoundaries caps the boundaries hashed per request: a
// conversation longer than this is keyed and matched on its first
// maxPrefixBoundaries messages (the prefix a backend would reuse anyway
// starts there), so a huge message list costs no more than this many
// table lookups per candidate.
const maxPrefixBoundaries = 512

// prefixOf appends to dst the conversation prefix of a request body for
// prefix-affinity routing (R1, routing.Chain): the chain starts with
// the model name and the preamble — Anthropic "system", Responses
// "instructions", "tools", and on chat completions and Responses the
// leading "system"/"developer" messages — then adds one boundary per
// message from the first other message on: chat completions and Anthropic
// "messages", Responses "input" (a string is one message; an array one per
// item). The first boundary is the conversation key. It returns dst
// unchanged when the body carries no conversation: count_tokens (nothing
// is generated, nothing cached), /v1/completions (one prompt string, no
// message boundaries) and /v1/embeddings, an empty message list, or a Responses
// request continuing a stored response (previous_response_id: the
// conversation lives on the server, not in the body).
//
// The body must have passed parseHead (valid JSON, an object). Cost: one
// pass over the top level, one over each message's members to find its
// role, and one maphash pass over the preamble and message bytes; no
// allocation while dst has room.
func prefixOf(hs *routing.Hasher, body []byte, ep *endpoint, model string, dst []uint64) []uint64 {
	var system, instructions, tools, msgs span
	var input span
	it, ok := jsonscan.NewMembers(body, jsonscan.All(body))
	if !ok {
		return dst
	}
	for {
		key, val, more := it.Next()
		if !more {
			break
		}
		switch {
		case jsonscan.KeyIs(key, "tools"):
			tools = val
		case ep == &epMessages && jsonscan.KeyIs(key, "system"):
			system = val
		case ep == &epMessages && jsonscan.KeyIs(key, "messages"), ep == &epChat && jsonscan.KeyIs(key, "messages"):
			msgs = val
		case ep == &epResponses && jsonscan.KeyIs(key, "instructions"):
			instructions = val
		case ep == &epResponses && jsonscan.KeyIs(key, "input"):
			input = val
		case ep == &epResponses && jsonscan.KeyIs(key, "previous_response_id"):
			if jsonscan.Kind(body, val) == '"' {
				return dst
			}
		}
	}
	if ep == &epResponses {
		msgs = input
	}
	ch := hs.Start(model)
	for _, v := range [...]span{system, instructions, tools} {
		if present := jsonscan.Kind(body, v); present != 0 && present != 'n' {
			ch.Add(body[v.Start:v.End])
		}
	}
	switch jsonscan.Kind(body, msgs) {
	case '"': // Responses "input": "text" is one user message
		return append(dst, ch.Add(body[msgs.Start:msgs.End]))
	case '[':
	default:
		return dst
	}
	els := jsonscan.NewElements(body, msgs)
	started := false
	for n := 0; n < maxPrefixBoundaries; {
		el, more := els.Next()
		if !more {
			break
		}
		b := body[el.Start:el.End]
		if !started && ep != &epMessages && isSystemRole(body, el) {
			ch.Add(b) // a leading system prompt is part of the preamble
			continue
		}
		started = true
		dst = append(dst, ch.Add(b))
		n++
	}
	return dst
}

// isSystemRole reports whether the message object at v has role "system"
// or "developer".
func isSystemRole(b []byte, v span) bool {
	it, ok := jsonscan.NewMembers(b, v)
	if !ok {
		return false
	}
	for {
		key, val, more := it.Next()
		if !more {
			return false
		}
		if jsonscan.KeyIs(key, "role") {
			if jsonscan.Kind(b, val) != '"' {
				return false
			}
			role := b[val.Start+1 : val.End-1]
			return string(role) == "system" || string(role) == "developer"
		}
	}
}
