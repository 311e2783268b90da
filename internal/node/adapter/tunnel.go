package adapter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"sort"
	"strings"

	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Tunnel executes one raw provider request (SPEC T1, T2, T4) and calls emit
// for each frame in order: RESPONSE_START (the upstream status and response
// headers) at most once, then BODY frames (the upstream body exactly as
// read, at most 32 KiB each, sent as they arrive — a stream is never
// buffered) and USAGE frames (token usage observed in the body, which is
// never modified), then exactly one END or ERROR; seq rises from 1. An
// upstream 4xx/5xx is relayed as the provider said it: RESPONSE_START with
// its status, its body, END. A failure after RESPONSE_START (reset, read
// error, cancel) is an ERROR after whatever BODY frames were sent. adapter
// and target are set on every frame except BODY.
//
// Every frame is a fresh value that emit may keep (e.g. queue for a writer
// goroutine), and so is a BODY frame's Body — unless
// Options.ReuseBodyBuffers is set: then Body is valid only until emit
// returns, and emit must serialize or copy it first. emit calls never
// overlap (frames come from the provider call's goroutine, the terminal from
// the calling one), never happen after Tunnel returns, and may block briefly
// (back-pressure from the session's send queue slows the upstream read).
//
// Stall watchdog: as Run's (SPEC H1–H7) — the response headers and every
// read that returned bytes are activity; a stall ends the tunnel, after
// whatever BODY frames were sent, with ERROR failure_code
// "response_stalled", Failure and the allow-listed Meta* metadata.
//
// The path is the profile's path for req.operation, or req.path when the
// operation is empty; a path that is absolute, has a host or escapes the
// base is an ERROR invalid_request without any upstream call (SPEC T1), as
// is a bad method. An operation the profile lacks is unsupported_operation.
// The request body goes upstream as req.body, except to an adapter whose
// profile has a priority_field (SPEC G7): a chat_completions, completions,
// responses or embeddings body then goes with its top-level "priority" set
// to the value of req.priority_class (upstream.SetPriority), and one that
// is not a JSON object is an ERROR invalid_request without an upstream call.
// Request headers: only Content-Type, Accept, anthropic-version,
// anthropic-beta and OpenAI-Beta are forwarded; client Authorization,
// x-api-key, cookies, hop-by-hop and X-Iop-* headers never are (SPEC T4).
// Upstream auth comes from the request's credential lease when the plane is
// on (opened after the capacity gate, SPEC C3), else from the adapter's
// api_key_env, either way in the profile's auth_header and auth_scheme. Response headers: all but hop-by-hop ones and
// Set-Cookie; a body in gzip or deflate is relayed decoded, without its
// Content-Encoding and Content-Length (SPEC B3). The other boundary checks
// are those of Run.
func (s *Set) Tunnel(ctx context.Context, runID string, req *iop.ProviderTunnelRequest, emit func(*iop.ProviderTunnelFrame)) {
	ctx = upstream.WithRequestID(ctx, req.GetRequestId()) // logs and the upstream's X-Request-Id
	ts := newSender[*iop.ProviderTunnelFrame](tunnelWire{}, req, iop.NodeSpanKind_NODE_SPAN_TUNNEL, emit)
	var path, method string
	body := req.GetBody()
	ad, ok := open(ctx, s, ts, runID, req, protocol.TypeOpenAICompat, func(inst *instance) *rejection {
		var err error
		if path, err = tunnelPath(inst.profile, req.GetOperation(), req.GetPath()); err != nil {
			code := protocol.CodeInvalidRequest
			if errors.Is(err, errUnsupported) {
				code = protocol.CodeUnsupportedOperation
			}
			return &rejection{code: code, msg: fmt.Sprintf("adapter %q: %v", inst.name, err), err: err}
		}
		if method, err = tunnelMethod(req.GetMethod(), len(req.GetBody()) > 0); err != nil {
			return reject(protocol.CodeInvalidRequest, err)
		}
		if f := inst.profile.GetPriorityField(); f != nil && len(body) > 0 && prioritized(inst.profile, req.GetOperation(), path) {
			// SPEC G7: the class's value replaces any the client sent
			if body, err = upstream.SetPriority(body, protocol.PriorityValue(f, req.GetPriorityClass())); err != nil {
				return &rejection{code: protocol.CodeInvalidRequest, msg: fmt.Sprintf("adapter %q: priority field: %v", inst.name, err), err: err}
			}
		}
		return nil
	})
	if !ok {
		return
	}
	defer ad.close()
	inst, a, ep, runCtx := ad.inst, ad.a, ad.ep, ad.runCtx
	p, m, b := path, method, body // captured by value below: path, method and body are written by the check
	s.supervise(ctx, a, runID, inst.name, req.GetTarget(), ts.supervised(
		func() func() {
			f := s.relay(ctx, ts.trace.context(runCtx), inst, ep, a, m, p, b, req, ts)
			ts.trace.returned()
			return func() { ts.end(f, true) }
		},
		func() *iop.ProviderTunnelFrame {
			return failFrame(ctx, runCtx, inst.name, "upstream request", a.pendingErr())
		},
		func(ctx context.Context) string { return s.probeWith(ctx, inst, inst.runnerFor(ep), req.GetTarget()) },
	))
}

// relay sends the request and streams the answer into frames; it returns
// the terminal frame (END or ERROR) for the caller to emit.
// body is the request's body as sent: req.body, or its copy with the
// backend's priority field set (SPEC G7).
func (s *Set) relay(ctx, runCtx context.Context, inst *instance, ep *upstream.Endpoint, a *attempt, method, path string, body []byte, req *iop.ProviderTunnelRequest, ts *sender[*iop.ProviderTunnelFrame]) *iop.ProviderTunnelFrame {
	var rd io.Reader = http.NoBody
	if len(body) > 0 {
		rd = bytes.NewReader(body)
	}
	hreq, err := ep.NewRequest(runCtx, method, path, rd)
	if err != nil {
		return errorFrame(protocol.CodeInvalidRequest, err.Error(), err)
	}
	forwardHeaders(hreq.Header, req.GetHeaders())
	if len(body) > 0 && hreq.Header.Get("Content-Type") == "" {
		hreq.Header.Set("Content-Type", "application/json")
	}
	resp, err := ep.Do(hreq)
	if err != nil {
		return failFrame(ctx, runCtx, inst.name, "upstream request", err)
	}
	defer resp.Body.Close()
	a.activity() // the response headers arrived (SPEC H1)
	ts.send(&iop.ProviderTunnelFrame{
		Kind:    iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START,
		Status:  int32(resp.StatusCode),
		Headers: responseHeaders(resp.Header),
	})
	scan := newUsageScanner(resp.StatusCode, resp.Header.Get("Content-Type"))
	bufp := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(bufp)
	buf := *bufp
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			a.activity() // any bytes, SSE comments and keep-alives included (SPEC H1)
			chunk := buf[:n]
			if !s.reuseBody {
				chunk = bytes.Clone(chunk)
			}
			ts.sendBare(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_BODY, Body: chunk})
			if u := scan.feed(buf[:n]); u != nil {
				ts.send(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_USAGE, Usage: u})
			}
		}
		if rerr == io.EOF {
			if u := scan.finish(); u != nil {
				ts.send(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_USAGE, Usage: u})
			}
			return &iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_END}
		}
		if rerr != nil {
			return failFrame(ctx, runCtx, inst.name, "upstream read", rerr)
		}
	}
}

// prioritized reports whether a tunnel to path, for operation op, is one
// whose body takes the backend's priority field (SPEC G7): the
// chat_completions, completions, responses and embeddings operations, or
// with no operation a path that is one of theirs in profile p. The
// Anthropic operations (messages, count_tokens) and models are not: vLLM's
// /v1/messages builds its chat request without a priority.
func prioritized(p *iop.ConcreteProtocolProfile, op, path string) bool {
	switch op {
	case protocol.OpChatCompletions, protocol.OpCompletions, protocol.OpResponses, protocol.OpEmbeddings:
		return true
	case "":
		bare := func(p string) string {
			p, _, _ = strings.Cut(p, "?")
			return strings.TrimPrefix(p, "/")
		}
		for _, q := range []string{p.GetChatCompletionsPath(), p.GetCompletionsPath(), p.GetResponsesPath(), p.GetEmbeddingsPath()} {
			if q != "" && bare(q) == bare(path) {
				return true
			}
		}
	}
	return false
}

// tunnelMethod validates the request method; empty means POST with a body
// and GET without.
func tunnelMethod(m string, hasBody bool) (string, error) {
	switch m {
	case "":
		if hasBody {
			return http.MethodPost, nil
		}
		return http.MethodGet, nil
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodHead:
		return m, nil
	}
	return "", fmt.Errorf("tunnel method %.32q is not GET, POST, PUT, PATCH, DELETE or HEAD", m)
}

// forwardable reports whether a client request header may go upstream
// (SPEC T4): an allow-list of content negotiation and API-version headers.
// Everything else — Authorization, x-api-key, Cookie, hop-by-hop headers,
// Host, Content-Length, X-Forwarded-*, X-Iop-* — is dropped.
func forwardable(canonical string) bool {
	switch canonical {
	case "Content-Type", "Accept", "Anthropic-Version", "Anthropic-Beta", "Openai-Beta":
		return true
	}
	return false
}

func forwardHeaders(dst http.Header, hs []*iop.Header) {
	for _, h := range hs {
		name := textproto.CanonicalMIMEHeaderKey(h.GetName())
		if !forwardable(name) || strings.ContainsAny(h.GetValue(), "\r\n\x00") {
			continue
		}
		dst.Add(name, h.GetValue())
	}
}

// responseHeaders returns the upstream response headers to relay, sorted by
// name: all but hop-by-hop headers (RFC 9110 §7.6.1, including those the
// Connection header names) and Set-Cookie.
func responseHeaders(h http.Header) []*iop.Header {
	drop := map[string]bool{}
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			drop[textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(f))] = true
		}
	}
	names := make([]string, 0, len(h))
	for name := range h {
		switch name {
		case "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
			"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Set-Cookie":
			continue
		}
		if !drop[name] {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	out := make([]*iop.Header, 0, len(names))
	for _, name := range names {
		for _, v := range h[name] {
			out = append(out, &iop.Header{Name: name, Value: v})
		}
	}
	return out
}

// errorFrame is an ERROR frame of code: msg is the legacy error string, err
// (nil for none) gives the client's words (message).
func errorFrame(code protocol.Code, msg string, err error) *iop.ProviderTunnelFrame {
	return &iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_ERROR, Error: msg, FailureCode: code.String(),
		Message: message(code, err)}
}

// failFrame is the terminal of a failed request or read: cancelled when
// ctx ended (SPEC E5, T3; node_shutdown when the node's drain ended it), timeout when timeout_sec expired,
// upstream_connect or upstream_reset when the request got no response head
// (*upstream.RequestError), upstream_error otherwise.
func failFrame(ctx, runCtx context.Context, adapter, what string, err error) *iop.ProviderTunnelFrame {
	var re *upstream.RequestError
	switch {
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrNodeShutdown):
		return errorFrame(protocol.CodeNodeShutdown, "tunnel cancelled: "+ErrNodeShutdown.Error(), nil)
	case ctx.Err() != nil:
		return errorFrame(protocol.CodeCancelled, fmt.Sprintf("tunnel cancelled: %v", context.Cause(ctx)), nil)
	case runCtx.Err() != nil && errors.Is(context.Cause(runCtx), errRunDeadline):
		return errorFrame(protocol.CodeTimeout, fmt.Sprintf("adapter %q: %s: %v", adapter, what, errRunDeadline), nil)
	case errors.As(err, &re):
		return errorFrame(requestErrorCode(re), fmt.Sprintf("adapter %q: %s: %v", adapter, what, err), nil)
	}
	return errorFrame(protocol.CodeUpstreamError, fmt.Sprintf("adapter %q: %s: %v", adapter, what, err), err)
}
