package exchange

import (
	"bytes"
	"iop/internal/edge/reply"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	apisurface "iop/internal/edge/surface"
	"iop/internal/jsonscan"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// tunnelSink relays one tunnel's ProviderTunnelFrames to the client (SPEC
// T2, T5):
//
//   - RESPONSE_START: the upstream status and the allowed response headers
//     (Content-Type, Retry-After and the ones clients read about their
//     limits and the request: relayedHeader) are kept until the first
//     BODY, so an ERROR before any byte can still become a proper 502/504;
//   - BODY: a stream (SSE, NDJSON, or a request that asked to stream) is
//     written and flushed as it arrives, bytes unchanged; a plain body is
//     held until END (up to maxHeldBody, then passed through) and sent
//     whole with a Content-Length, so an ERROR before END still becomes a
//     clean 502 instead of a truncated body; an upstream 4xx/5xx thus
//     reaches the client with its own status and body;
//   - USAGE: observation only (Deps.OnUsage), never written;
//   - END: done (a response with no body gets the upstream status);
//   - ERROR: before any byte an error response in the surface's shape;
//     after bytes an SSE error event (OpenAI `data: {"error":…}`,
//     Anthropic `event: error`, the Responses API's `event: error`) when
//     the body is an event stream, else the
//     connection is aborted so the client sees a truncated response, never
//     a complete-looking one.
type tunnelSink struct {
	h *Engine
	x *Exchange

	started    bool // RESPONSE_START seen
	status     int
	ctype      string
	retryAfter string
	relayed    []*iop.Header // the RESPONSE_START headers relayedHeader lets through

	committed bool // status line written
	finished  bool // terminal outcome written
	failed    *reply.Error
	sse       bool
	tail      [2]byte // last two body bytes written
	end       sseEnd  // whether the event stream written so far carried its own last event
	buf       []byte
	held      []byte // a plain body kept until END
}

// maxHeldBody bounds the plain (non-stream) body held until END, in bytes;
// a larger one is passed through as it arrives.
const maxHeldBody = 1 << 20

// MaxHeldBody is maxHeldBody, for the tests that meet it from outside.
const MaxHeldBody = maxHeldBody

// streaming reports whether the body is relayed frame by frame.
func (s *tunnelSink) streaming() bool {
	if s.sse || s.x.Stream {
		return true
	}
	ct := strings.ToLower(s.ctype)
	return strings.HasPrefix(ct, "application/x-ndjson") || strings.HasPrefix(ct, "application/jsonl")
}

func (s *tunnelSink) handle(env *iop.Envelope) (bool, error) {
	f := env.GetTunnelFrame()
	if f == nil {
		return false, nil
	}
	switch f.Kind {
	case iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START:
		if !s.started {
			s.started = true
			s.status = int(f.Status)
			for _, hd := range f.Headers {
				switch {
				case strings.EqualFold(hd.Name, "Content-Type"):
					s.ctype = hd.Value
					s.sse = strings.HasPrefix(strings.ToLower(hd.Value), "text/event-stream")
				case strings.EqualFold(hd.Name, "Retry-After"):
					s.retryAfter = hd.Value
				case len(s.relayed) < maxRelayedHeaders && relayedHeader(hd.Name) && len(hd.Value) <= maxRelayedValue &&
					!strings.ContainsAny(hd.Value, "\r\n\x00") && (s.h.o.OpenMode() || !rateLimitHeader(hd.Name)):
					s.relayed = append(s.relayed, hd)
				}
			}
		}
	case iop.TunnelFrameKind_TUNNEL_FRAME_BODY:
		if len(f.Body) == 0 {
			return false, nil
		}
		stream := s.streaming()
		s.noteCost(f.Body)
		if !s.committed {
			if !stream && len(s.held)+len(f.Body) <= maxHeldBody {
				s.held = append(s.held, f.Body...)
				return false, nil
			}
			if done, err := s.commitHeld(); done || err != nil {
				return true, err
			}
		}
		if _, err := s.x.out.W.Write(f.Body); err != nil {
			return true, err
		}
		s.noteTail(f.Body)
		if s.sse {
			s.end.scan(f.Body, s.x.Endpoint)
		}
		if stream { // T2: a stream is never buffered
			if err := s.x.out.Flush(); err != nil {
				return true, err
			}
		}
	case iop.TunnelFrameKind_TUNNEL_FRAME_USAGE:
		if f.Usage != nil {
			s.x.Acc.SetUsage(f.Usage)
			if s.h.o.OnUsage != nil {
				s.h.o.OnUsage(s.x.Principal, s.x.Model, f.Usage)
			}
		}
	case iop.TunnelFrameKind_TUNNEL_FRAME_END:
		if !s.committed {
			if s.started {
				s.x.out.W.Header().Set("Content-Length", strconv.Itoa(len(s.held)))
			}
			if done, err := s.commitHeld(); done || err != nil {
				return true, err
			}
		}
		s.finished = true
		return true, nil
	case iop.TunnelFrameKind_TUNNEL_FRAME_ERROR:
		return true, s.fail(nodeFailure(f.FailureCode, f.Message, f.Error, 0, f.Failure))
	}
	return false, nil
}

// commit writes the status line and the allowed headers. It fails the
// response with a 502 instead when the node sent no valid RESPONSE_START.
func (s *tunnelSink) commit() bool {
	if !s.started || s.status < 200 || s.status > 599 {
		_ = s.fail(reply.BadGateway("provider_error", "the provider's response had no valid status"))
		return false
	}
	s.committed = true
	h := s.x.out.W.Header()
	if s.ctype != "" {
		h.Set("Content-Type", s.ctype)
		if s.sse {
			h.Set("Cache-Control", "no-cache")
			h.Set("X-Accel-Buffering", "no")
		}
	}
	if s.retryAfter != "" {
		h.Set("Retry-After", s.retryAfter)
	}
	var own map[string]bool // names the edge set itself: never joined by the upstream's
	for _, hd := range s.relayed {
		if k := textproto.CanonicalMIMEHeaderKey(hd.Name); h[k] != nil {
			if own == nil {
				own = map[string]bool{}
			}
			own[k] = true
		}
	}
	for _, hd := range s.relayed {
		if !own[textproto.CanonicalMIMEHeaderKey(hd.Name)] {
			h.Add(hd.Name, hd.Value)
		}
	}
	s.x.out.W.WriteHeader(s.status)
	return true
}

// The bounds of the relayed response headers: a node or a backend that
// sends many or long ones costs the client response nothing unbounded.
const (
	maxRelayedHeaders = 32
	maxRelayedValue   = 256
)

// relayedHeader reports whether an upstream response header reaches the
// client besides Content-Type and Retry-After (SPEC T2 passes the body
// unchanged; the headers are the Edge's to choose). It is an allow-list of
// what clients read about the answer and their limits: OpenAI's
// x-ratelimit-*, openai-processing-ms, openai-version, openai-organization
// and openai-project (the OpenAI API reference's "Debugging requests"
// headers; the SDKs expose them on the raw response), Anthropic's anthropic-ratelimit-*
// and request-id, the SDKs' retry hints retry-after-ms and x-should-retry.
// Not a deny-list, because the node and the backend are less trusted than
// the Edge: any other header could set cookies or CORS, caching or
// security policy on the Edge's origin, redirect (Location), or shadow the
// Edge's own (X-Request-Id, Iop-Ignored-Fields, Content-Length); a header
// a client starts to read is one line here.
func relayedHeader(name string) bool {
	n := strings.ToLower(name)
	switch n {
	case "request-id", "openai-processing-ms", "openai-version", "openai-organization", "openai-project", "retry-after-ms", "x-should-retry":
		return true
	}
	for _, prefix := range [...]string{"x-ratelimit-", "anthropic-ratelimit-"} {
		if len(n) > len(prefix) && strings.HasPrefix(n, prefix) {
			return validToken(n)
		}
	}
	return false
}

// rateLimitHeader reports whether name is a rate-limit header
// (x-ratelimit-*, anthropic-ratelimit-*). With API keys on, the upstream's
// are not relayed (K6): they describe the upstream account every key
// shares, so they would tell one key how much the others use, and they
// would stand beside the key's own headers of the same names, which the
// edge sets. In open mode (no keys, one tenant) they pass.
func rateLimitHeader(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "x-ratelimit-") || strings.HasPrefix(n, "anthropic-ratelimit-")
}

// validToken reports whether s is an RFC 9110 token (a header name).
func validToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return s != ""
}

// commitHeld commits the response and writes the plain body held so far.
// done: commit failed the response instead (no valid RESPONSE_START).
func (s *tunnelSink) commitHeld() (done bool, err error) {
	if !s.commit() {
		return true, nil
	}
	if len(s.held) > 0 {
		_, err = s.x.out.W.Write(s.held)
		s.held = nil
	}
	return false, err
}

// noteCost adds to the answer's least cost (reply.Recorder.MinTokens,
// K5) what body b shows of the completion when the upstream reports no
// usage: one token per event of an event stream (an OpenAI chat or
// completions stream without stream_options.include_usage: each chunk
// carries at least one token), b's bytes ÷ 4 of any other body. Call it
// before noteTail: an event's blank line may straddle two frames.
func (s *tunnelSink) noteCost(b []byte) {
	if !s.sse {
		s.x.Acc.MinTokens += int64(len(b) / 4)
		return
	}
	n := 0
	for i := bytes.IndexByte(b, '\n'); i >= 0; {
		// the two bytes before the newline, in b or in the tail
		var p1, p2 byte
		switch i {
		case 0:
			p1, p2 = s.tail[1], s.tail[0]
		case 1:
			p1, p2 = b[0], s.tail[1]
		default:
			p1, p2 = b[i-1], b[i-2]
		}
		if p1 == '\n' || p1 == '\r' && p2 == '\n' { // "\n\n" or "\n\r\n": an event ends
			n++
		}
		j := bytes.IndexByte(b[i+1:], '\n')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	s.x.Acc.MinTokens += int64(n)
}

func (s *tunnelSink) noteTail(b []byte) {
	if len(b) >= 2 {
		s.tail = [2]byte{b[len(b)-2], b[len(b)-1]}
	} else {
		s.tail = [2]byte{s.tail[1], b[0]}
	}
}

func (s *tunnelSink) fail(e *reply.Error) error {
	if s.finished {
		return nil
	}
	s.finished, s.failed = true, e
	if !s.committed {
		s.committed = true
		reply.WriteError(s.x.out.W, s.x.Endpoint.Surface, e)
		return nil
	}
	if !s.sse {
		s.x.abort = true
		return nil
	}
	s.buf = s.buf[:0]
	if ended, open := s.end.ended(); ended {
		// The upstream's stream already carried its last event ([DONE],
		// message_stop, response.completed…): the client has its one
		// terminal, and an error event after it would be a second (SPEC
		// T2, T5). The failure stays the request's outcome (the access
		// record); a last event cut before its blank line is ended.
		if !open {
			return nil
		}
		return s.x.out.Send(append(s.buf, '\n'))
	}
	if s.tail != [2]byte{'\n', '\n'} {
		// The last BODY frame may have ended inside an event: close it so
		// the error is an event of its own.
		s.buf = append(s.buf, '\n', '\n')
	}
	s.buf = reply.AppendErrorEvent(s.buf, s.x.Endpoint.Surface, s.x.Endpoint.Operation, e)
	return s.x.out.Send(s.buf)
}

func (s *tunnelSink) failure() *reply.Error { return s.failed }

func (s *tunnelSink) wrote() bool { return s.committed }

// sseEnd follows the lines of a relayed event stream (text/event-stream,
// WHATWG HTML §9.2) far enough to tell whether its last event is the
// surface's own last one: OpenAI's "data: [DONE]" (Chat Completions,
// Completions), Anthropic's message_stop or error event (Messages
// streaming), the Responses API's response.completed, response.failed,
// response.incomplete or error event. A failure after it (the node's
// connection lost before the tunnel's END) then adds no error event: the
// client already has exactly one terminal (SPEC T2, T5). Only a line's
// first maxMarkerLine bytes are kept across BODY frames; a longer line is
// no marker.
type sseEnd struct {
	line [maxMarkerLine]byte // the current line's first bytes
	n    int                 // bytes of the current line seen; maxMarkerLine+1: too long to be a marker
	last bool                // the current event (not dispatched yet) has a last-event line
	done bool                // a last event was dispatched and no line followed it
}

// maxMarkerLine bounds the marker lines sseEnd recognises, in bytes.
const maxMarkerLine = 32

// ended reports whether the stream written so far ends with the surface's
// last event and nothing after it; open: that event still needs its
// blank line (a line feed ends it).
func (e *sseEnd) ended() (ended, open bool) {
	blank := e.n == 0 || e.n == 1 && e.line[0] == '\r' // nothing of a next line but a CR
	switch {
	case e.done && blank && e.n == 0:
		return true, false
	case e.done && blank:
		return true, true // "\r" of a blank line after the dispatched event: end it
	case e.last && blank:
		return true, true
	}
	return false, false
}

// scan takes the next body bytes of the stream of ep's surface.
func (e *sseEnd) scan(b []byte, ep *Endpoint) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		part := b
		if i >= 0 {
			part = b[:i]
		}
		switch {
		case e.n > maxMarkerLine:
		case e.n+len(part) > maxMarkerLine:
			e.n = maxMarkerLine + 1
		default:
			e.n += copy(e.line[e.n:], part)
		}
		if i < 0 {
			return
		}
		e.endLine(ep)
		b = b[i+1:]
	}
}

// endLine handles the current line at its line feed.
func (e *sseEnd) endLine(ep *Endpoint) {
	n := e.n
	e.n = 0
	if n > maxMarkerLine {
		e.done = false // a long line: content, no marker
		return
	}
	line := bytes.TrimSuffix(e.line[:n], []byte{'\r'})
	switch {
	case len(line) == 0: // a blank line dispatches the event
		if e.last {
			e.done, e.last = true, false
		}
	case lastEventLine(line, ep):
		e.done, e.last = false, true
	default:
		e.done = false
	}
}

// lastEventLine reports whether line (no line break) marks the last event
// of ep's surface's stream.
func lastEventLine(line []byte, ep *Endpoint) bool {
	field, value, _ := bytes.Cut(line, []byte{':'})
	value = bytes.TrimPrefix(value, []byte{' '})
	switch {
	case ep.Surface == reply.Anthropic:
		return string(field) == "event" && (string(value) == "message_stop" || string(value) == "error")
	case ep.Operation == protocol.OpResponses:
		if string(field) != "event" {
			return false
		}
		switch string(value) {
		case "response.completed", "response.failed", "response.incomplete", "error":
			return true
		}
		return false
	}
	return string(field) == "data" && string(value) == "[DONE]"
}

// Client request headers a tunnel forwards (SPEC T4). Everything else —
// Authorization, x-api-key, cookies, hop-by-hop and X-Iop-* headers — stays
// at the Edge; upstream auth comes from the adapter config or a lease.
var forwardedRequestHeaders = [...]struct{ canon, wire string }{
	{"Content-Type", "Content-Type"},
	{"Accept", "Accept"},
	{"Anthropic-Version", "anthropic-version"},
	{"Anthropic-Beta", "anthropic-beta"},
	{"Openai-Beta", "OpenAI-Beta"},
}

func forwardHeaders(h http.Header) []*iop.Header {
	var out []*iop.Header
	for _, f := range forwardedRequestHeaders {
		for _, v := range h[f.canon] {
			out = append(out, &iop.Header{Name: f.wire, Value: v})
		}
	}
	return out
}

// SpliceModel returns body with every value span in spans replaced by the
// JSON string target: one allocation of the final size and one copy, every
// other byte unchanged (SPEC Q3: the client's body with only "model"
// replaced). spans are in ascending order and do not overlap.
func SpliceModel(body []byte, spans []jsonscan.Span, target string) []byte {
	var q [128]byte
	quoted := apisurface.AppendString(q[:0], target)
	n := len(body)
	for _, s := range spans {
		n += len(quoted) - (s.End - s.Start)
	}
	out := make([]byte, 0, n)
	prev := 0
	for _, s := range spans {
		out = append(out, body[prev:s.Start]...)
		out = append(out, quoted...)
		prev = s.End
	}
	return append(out, body[prev:]...)
}
