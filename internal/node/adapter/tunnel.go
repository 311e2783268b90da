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
	"sync"

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
// returns, and emit must serialize or copy it first. emit is called only
// from the calling goroutine and never after Tunnel returns; it may block
// briefly (back-pressure from the session's send queue slows the upstream
// read).
//
// The path is the profile's path for req.operation, or req.path when the
// operation is empty; a path that is absolute, has a host or escapes the
// base is an ERROR invalid_request without any upstream call (SPEC T1), as
// is a bad method. An operation the profile lacks is unsupported_operation.
// Request headers: only Content-Type, Accept, anthropic-version,
// anthropic-beta and OpenAI-Beta are forwarded; client Authorization,
// x-api-key, cookies, hop-by-hop and X-Iop-* headers never are (SPEC T4).
// Upstream auth comes from the adapter's api_key_env with the profile's
// auth_header and auth_scheme. Response headers: all but hop-by-hop ones and
// Set-Cookie. The other boundary checks are those of Run.
func (s *Set) Tunnel(ctx context.Context, runID string, req *iop.ProviderTunnelRequest, emit func(*iop.ProviderTunnelFrame)) {
	ts := &tunnelStream{emit: emit, adapter: req.GetAdapter(), target: req.GetTarget()}
	inst, err := s.lookup(req.GetAdapter(), TypeOpenAICompat)
	if err != nil {
		ts.fail(CodeUnknownAdapter, err.Error())
		return
	}
	ts.adapter = inst.name
	a, code, err := s.admit(inst, req.GetResponseStallTimeoutMs(), req.GetTimeoutSec(), req.GetCredentialLease() != nil, req.GetCredentialBinding() != nil)
	if err != nil {
		ts.fail(code, err.Error())
		return
	}
	path, err := tunnelPath(inst.profile, req.GetOperation(), req.GetPath())
	if err != nil {
		code := CodeInvalidRequest
		if errors.Is(err, errUnsupported) {
			code = CodeUnsupportedOperation
		}
		ts.fail(code, fmt.Sprintf("adapter %q: %v", inst.name, err))
		return
	}
	method, err := tunnelMethod(req.GetMethod(), len(req.GetBody()) > 0)
	if err != nil {
		ts.fail(CodeInvalidRequest, err.Error())
		return
	}
	if !inst.gate.tryAcquire() {
		ts.fail(CodeOverCapacity, fmt.Sprintf("adapter %q is at its capacity of %d concurrent requests", inst.name, inst.gate.limit))
		return
	}
	release := sync.OnceFunc(inst.gate.release)
	ts.beforeTerminal = release
	defer release()
	runCtx, cancel := a.context(ctx)
	defer cancel()
	s.relay(ctx, runCtx, inst, a, method, path, req, ts)
}

// relay sends the request and streams the answer into frames.
func (s *Set) relay(ctx, runCtx context.Context, inst *instance, a *attempt, method, path string, req *iop.ProviderTunnelRequest, ts *tunnelStream) {
	var body io.Reader = http.NoBody
	if len(req.GetBody()) > 0 {
		body = bytes.NewReader(req.GetBody())
	}
	hreq, err := inst.ep.NewRequest(runCtx, method, path, body)
	if err != nil {
		ts.fail(CodeInvalidRequest, err.Error())
		return
	}
	forwardHeaders(hreq.Header, req.GetHeaders())
	if len(req.GetBody()) > 0 && hreq.Header.Get("Content-Type") == "" {
		hreq.Header.Set("Content-Type", "application/json")
	}
	resp, err := inst.ep.Client.Do(hreq)
	if err != nil {
		ts.failAttempt(ctx, runCtx, inst.name, "upstream request", err)
		return
	}
	defer resp.Body.Close()
	a.activity()
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
			a.activity()
			chunk := buf[:n]
			if !s.reuseBody {
				chunk = bytes.Clone(chunk)
			}
			ts.sendBody(chunk)
			if u := scan.feed(buf[:n]); u != nil {
				ts.send(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_USAGE, Usage: u})
			}
		}
		if rerr == io.EOF {
			if u := scan.finish(); u != nil {
				ts.send(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_USAGE, Usage: u})
			}
			ts.send(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_END})
			return
		}
		if rerr != nil {
			ts.failAttempt(ctx, runCtx, inst.name, "upstream read", rerr)
			return
		}
	}
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

// tunnelStream numbers and emits the frames of one tunnel.
type tunnelStream struct {
	emit            func(*iop.ProviderTunnelFrame)
	seq             uint64
	adapter, target string
	// beforeTerminal: as runStream's, before END or ERROR.
	beforeTerminal func()
}

func (t *tunnelStream) send(f *iop.ProviderTunnelFrame) {
	if (f.Kind == iop.TunnelFrameKind_TUNNEL_FRAME_END || f.Kind == iop.TunnelFrameKind_TUNNEL_FRAME_ERROR) && t.beforeTerminal != nil {
		t.beforeTerminal()
	}
	t.seq++
	f.Seq = t.seq
	f.Adapter = t.adapter
	f.Target = t.target
	t.emit(f)
}

// sendBody emits a BODY frame without adapter and target (they are on every
// other frame), keeping the relay to one allocation per frame besides the
// body.
func (t *tunnelStream) sendBody(b []byte) {
	t.seq++
	t.emit(&iop.ProviderTunnelFrame{Seq: t.seq, Kind: iop.TunnelFrameKind_TUNNEL_FRAME_BODY, Body: b})
}

func (t *tunnelStream) fail(code, msg string) {
	t.send(&iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_ERROR, Error: msg, FailureCode: code})
}

// failAttempt ends the tunnel after a failed request or read: cancelled when
// ctx ended (SPEC E5, T3), timeout when timeout_sec expired, upstream_error
// otherwise.
func (t *tunnelStream) failAttempt(ctx, runCtx context.Context, adapter, what string, err error) {
	switch {
	case ctx.Err() != nil:
		t.fail(CodeCancelled, fmt.Sprintf("tunnel cancelled: %v", context.Cause(ctx)))
	case runCtx.Err() != nil && errors.Is(context.Cause(runCtx), errRunDeadline):
		t.fail(CodeTimeout, fmt.Sprintf("adapter %q: %s: %v", adapter, what, errRunDeadline))
	default:
		t.fail(CodeUpstreamError, fmt.Sprintf("adapter %q: %s: %v", adapter, what, err))
	}
}
