package api

import (
	"bytes"
	"encoding/json"

	"iop/internal/edge/exchange"
	"iop/internal/edge/reply"
	apisurface "iop/internal/edge/surface"
	"iop/internal/jsonscan"
)

// head is what the surface reads from a request body before it queues:
// enough to validate, admit and route it. Nested values are not decoded.
type head struct {
	model        string
	modelSpans   []span // every top-level "model" value, ascending
	spanBuf      [2]span
	stream       bool
	includeUsage bool
	// maxTokens is the completion's bound the request sets (max_tokens,
	// max_completion_tokens or max_output_tokens: a key's token
	// reservation, K5); 0 when none or not a non-negative integer (the
	// surface refuses what is invalid).
	maxTokens int64
	// serviceTier is the body's service_tier string, "" when none
	// (priority.go, SPEC G4).
	serviceTier string
	// prefix is the conversation prefix for prefix_affinity routing
	// (prefixOf), nil for other groups; it lives in prefixBuf up to 8
	// boundaries.
	prefix    []uint64
	prefixBuf [8]uint64
}

// parseHead validates body as one JSON object and reads its top level:
// "model" (required, a non-empty string), "stream" (boolean), for chat
// "stream_options.include_usage" (boolean), and the endpoint's required
// array field. Errors are 400s naming the field.
func parseHead(body []byte, ep *endpoint, hd *head) *reply.Error {
	if !json.Valid(body) {
		var v struct{}
		return jsonFieldError(json.Unmarshal(body, &v))
	}
	all := jsonscan.All(body)
	it, ok := jsonscan.NewMembers(body, all)
	if !ok {
		return apisurface.BadRequest("", "request body must be a JSON object")
	}
	hd.modelSpans = hd.spanBuf[:0]
	var modelOK, haveField bool
	for {
		key, val, more := it.Next()
		if !more {
			break
		}
		switch {
		case jsonscan.KeyIs(key, "model"):
			s, ok := jsonString(body, val)
			if !ok {
				return apisurface.BadRequest("model", "field \"model\" must be a string")
			}
			hd.model, modelOK = s, true
			hd.modelSpans = append(hd.modelSpans, val)
		case jsonscan.KeyIs(key, "stream"):
			switch jsonscan.Kind(body, val) {
			case 't':
				hd.stream = true
			case 'f', 'n':
				hd.stream = false
			default:
				return apisurface.BadRequest("stream", "field \"stream\" must be a boolean")
			}
		case ep.Run == exchange.RunChat && jsonscan.KeyIs(key, "stream_options"):
			switch jsonscan.Kind(body, val) {
			case 'n':
			case '{':
				so, _ := jsonscan.NewMembers(body, val)
				for {
					k, v, more := so.Next()
					if !more {
						break
					}
					if jsonscan.KeyIs(k, "include_usage") {
						switch jsonscan.Kind(body, v) {
						case 't':
							hd.includeUsage = true
						case 'f', 'n':
							hd.includeUsage = false
						default:
							return apisurface.BadRequest("stream_options.include_usage", "field \"stream_options.include_usage\" must be a boolean")
						}
					}
				}
			default:
				return apisurface.BadRequest("stream_options", "field \"stream_options\" must be an object")
			}
		case jsonscan.KeyIs(key, "service_tier"):
			hd.serviceTier, _ = jsonString(body, val)
		case jsonscan.KeyIs(key, "max_tokens") || jsonscan.KeyIs(key, "max_completion_tokens") || jsonscan.KeyIs(key, "max_output_tokens"):
			hd.maxTokens = max(hd.maxTokens, jsonInt(body, val))
		case ep.field != "" && jsonscan.KeyIs(key, ep.field):
			if jsonscan.Kind(body, val) != '[' {
				return apisurface.BadRequest(ep.field, "field %q must be an array of message objects", ep.field)
			}
			haveField = true
		default:
			if name := foldedHeadKey(key, ep); name != "" {
				k := jsonscan.Key(key)
				return apisurface.BadRequest(k, "field %q: keys are case-sensitive; this API's field is %q", k, name)
			}
		}
	}
	switch {
	case !modelOK:
		return apisurface.BadRequest("model", "missing required field \"model\"")
	case hd.model == "":
		return apisurface.BadRequest("model", "field \"model\" must not be empty")
	case ep.field != "" && !haveField:
		return apisurface.BadRequest(ep.field, "missing required field %q", ep.field)
	}
	return nil
}

// foldedHeadKey returns the head field ("model", "stream",
// "stream_options", the endpoint's required field) that the raw top-level
// key spells in another case, or "" when it spells none. The edge routes on
// the exact keys, but a backend decoding with Go's encoding/json (Ollama)
// matches keys case-insensitively and lets the last one win: a tunnelled
// {"model":"a","MODEL":"b"} would be routed to group a and served by the
// backend's model b, a target no model group names (SPEC Q1). The keys are
// refused instead. The comparison is Unicode simple folding, as
// encoding/json's ("ſtream" folds to "stream"); it allocates only for a key
// with escapes (TestParseHeadAllocs).
func foldedHeadKey(raw []byte, ep *endpoint) string {
	if len(raw) > 128 { // "stream_options" with every byte escaped is 84
		return ""
	}
	k := raw
	if bytes.IndexByte(raw, '\\') >= 0 {
		k = []byte(jsonscan.Key(raw)) // a key written with escapes (rare)
	}
	for _, name := range [...]string{"model", "stream", "stream_options", ep.field} {
		if name != "" && string(k) != name && bytes.EqualFold(k, []byte(name)) {
			return name
		}
	}
	return ""
}
