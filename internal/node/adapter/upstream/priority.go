package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"iop/internal/jsonscan"
)

// The backend's own priority scheduling (SPEC G7). When an adapter's
// profile has a priority_field, the node sets the top-level "priority"
// member of the JSON body of every chat, completion, response and
// embedding request it sends that backend to the number of the request's
// class: on the tunnel path by splicing the client's body (SetPriority),
// on the run path in the body it builds (a call made under WithPriority).
// A client's own "priority" never reaches such a backend.

type priorityKey struct{}

// WithPriority returns ctx asking the OpenAI-compatible request bodies
// built under it to carry "priority": n (SPEC G7).
func WithPriority(ctx context.Context, n int32) context.Context {
	return context.WithValue(ctx, priorityKey{}, n)
}

// PriorityOf returns the value WithPriority put on ctx; ok is false when
// none was.
func PriorityOf(ctx context.Context) (n int32, ok bool) {
	n, ok = ctx.Value(priorityKey{}).(int32)
	return n, ok
}

// SetPriority returns body, one JSON object, with the value of every
// top-level member whose key is "priority" — escapes decoded, in any
// letter case (a decoder that ignores case reads those too) — replaced by
// n, and with "priority":n appended as the last member when no key is
// exactly "priority"; every other byte stays as it was. So whichever
// duplicate a backend's decoder keeps, it reads n. body is never
// modified. Errors wrap ErrInvalidInput: body is not valid JSON, or not
// an object.
func SetPriority(body []byte, n int32) ([]byte, error) {
	if !json.Valid(body) {
		return nil, fmt.Errorf("%w: the request body is not valid JSON", ErrInvalidInput)
	}
	it, ok := jsonscan.NewMembers(body, jsonscan.All(body))
	if !ok {
		return nil, fmt.Errorf("%w: the request body is not a JSON object", ErrInvalidInput)
	}
	var num [12]byte
	v := strconv.AppendInt(num[:0], int64(n), 10)
	var spanBuf [2]jsonscan.Span
	spans := spanBuf[:0]
	members, exact := 0, false
	for {
		key, val, more := it.Next()
		if !more {
			break
		}
		members++
		if match, ex := priorityMember(key); match {
			spans = append(spans, val)
			exact = exact || ex
		}
	}
	out := make([]byte, 0, len(body)+len(`,"priority":`)+len(v))
	prev := 0
	for _, s := range spans {
		out = append(out, body[prev:s.Start]...)
		out = append(out, v...)
		prev = s.End
	}
	rest := body[prev:]
	if exact {
		return append(out, rest...), nil
	}
	end := bytes.LastIndexByte(rest, '}') // the object's own: only space may follow it
	out = append(out, rest[:end]...)
	if members > 0 {
		out = append(out, ',')
	}
	out = append(out, `"priority":`...)
	out = append(out, v...)
	return append(out, rest[end:]...), nil
}

// priorityMember reports whether the raw key (escapes intact) decodes to
// "priority" in some letter case, and whether exactly to "priority". A
// key without escapes is compared in place; only an escaped one is
// decoded (and allocates).
func priorityMember(raw []byte) (match, exact bool) {
	if bytes.IndexByte(raw, '\\') < 0 {
		if len(raw) != len("priority") {
			return false, false
		}
		return bytes.EqualFold(raw, []byte("priority")), string(raw) == "priority"
	}
	k := jsonscan.Key(raw)
	return strings.EqualFold(k, "priority"), k == "priority"
}
