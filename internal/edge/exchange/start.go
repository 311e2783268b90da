package exchange

import (
	"errors"
	"net/http"

	"iop/internal/edge/access"
	"iop/internal/edge/creds"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/reply"
	apisurface "iop/internal/edge/surface"
	"iop/internal/edge/surface/anthropic"
	"iop/internal/edge/surface/openai"
	"iop/internal/edge/surface/responses"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// start sends the request on x.lease by lease type (SPEC Q3) and returns
// the stream and the sink that relays it; nil when it answered the request
// itself (the operation is not supported, the input is invalid, the node
// could not take it).
func (h *Engine) start(x *Exchange) (dispatch.Stream, sink) {
	l := x.lease
	switch {
	case l.Type == protocol.TypeOpenAICompat:
		return h.tunnel(x)
	case l.Type == protocol.TypeOllama && x.Endpoint.Run != RunNone:
		return h.run(x)
	case l.Type == protocol.TypeOllama:
		return h.tunnel(x) // the node's built-in Ollama profile (/v1/completions)
	}
	reply.WriteError(x.out.W, x.Endpoint.Surface, reply.BadGateway("operation_not_supported", "provider "+l.Provider+" of type "+
		l.Type+" cannot serve "+x.Endpoint.Path))
	return nil, nil
}

// tunnel sends the client's body with only "model" replaced by the lease's
// target (SPEC Q3: one splice, every other byte unchanged); its sink relays
// the provider's response frames.
func (h *Engine) tunnel(x *Exchange) (dispatch.Stream, sink) {
	l := x.lease
	out := x.Body
	if len(x.ModelSpans) != 1 || x.Model != l.Target {
		out = SpliceModel(x.Body, x.ModelSpans, l.Target)
	}
	req := &iop.ProviderTunnelRequest{
		Adapter: l.Provider, Target: l.Target, Method: http.MethodPost, Path: x.Endpoint.Path,
		Headers: forwardHeaders(x.Header), Body: out, Stream: x.Stream,
		Operation: x.Endpoint.Operation, ResponseStallTimeoutMs: l.StallTimeoutMs, RequestId: x.Acc.Rec.RequestID,
		Trace:         x.Acc.Trace.BeginAttempt(l, access.PathTunnel),
		PriorityClass: x.Sched.Priority.String(), // G7: the node may pass it to the backend
	}
	var ok bool
	if req.CredentialLease, req.CredentialBinding, ok = h.credential(x); !ok {
		return nil, nil
	}
	st, err := h.o.Dispatcher.StartTunnel(dispatch.Target{Node: l.Node, Generation: l.Generation}, req)
	if err != nil {
		h.startFailed(x, err)
		return nil, nil
	}
	return st, &tunnelSink{h: h, x: x}
}

func (h *Engine) startFailed(x *Exchange, err error) {
	msg := "the provider's node could not take the request"
	if errors.Is(err, dispatch.ErrNotReady) {
		msg = "the provider's node is no longer connected"
	}
	h.log.Warn("dispatch failed", "model", x.Model, "node", x.lease.Node, "provider", x.lease.Provider,
		"request_id", x.Acc.Rec.RequestID, "err", err)
	e := reply.BadGateway("provider_unavailable", msg)
	if ev := h.event(x, evStartFailed, x.Body == nil); h.step(x, &ev).stop {
		x.kept = kept{err: e} // nothing was sent: another candidate may take it
		return
	}
	reply.WriteError(x.out.W, x.Endpoint.Surface, e)
}

// run sends the normalized RunRequest (SPEC Q3) built by the endpoint's
// surface from the client's body; its sink encodes the run's events in that
// surface's response shape (SPEC T5).
func (h *Engine) run(x *Exchange) (dispatch.Stream, sink) {
	s, req, e := h.runSurface(x)
	if e != nil {
		reply.WriteError(x.out.W, x.Endpoint.Surface, e)
		return nil, nil
	}
	l := x.lease
	req.Adapter, req.Target, req.ResponseStallTimeoutMs = l.Provider, l.Target, l.StallTimeoutMs
	req.RequestId = x.Acc.Rec.RequestID
	req.Trace = x.Acc.Trace.BeginAttempt(l, access.PathRun)
	req.PriorityClass = x.Sched.Priority.String() // G7: the node may pass it to the backend
	var ok bool
	if req.CredentialLease, req.CredentialBinding, ok = h.credential(x); !ok {
		return nil, nil
	}
	st, err := h.o.Dispatcher.StartRun(dispatch.Target{Node: l.Node, Generation: l.Generation}, req)
	if err != nil {
		h.startFailed(x, err)
		return nil, nil
	}
	return st, s
}

// runSurface converts x's body with its endpoint's surface into the
// RunRequest's input and returns the sink that encodes the answer.
func (h *Engine) runSurface(x *Exchange) (sink, *iop.RunRequest, *apisurface.Error) {
	hold := x.lease.Type != protocol.TypeOllama // text tool calls (E9) only on openai_compat adapters
	switch x.Endpoint.Run {
	case RunChat:
		in, p, e := openai.ChatInputPolicy(x.Body, x.Unknown)
		if e != nil {
			return nil, nil, e
		}
		reportIgnored(x, &p.Ignored)
		s := &runSink[openai.Chat, *openai.Chat]{h: h, x: x, stream: x.Stream}
		s.enc.Init(openai.ChatOptions{Model: x.responseName(), ID: "chatcmpl-" + h.o.NewID(), Created: h.o.Now().Unix(),
			Stream: x.Stream, IncludeUsage: x.IncludeUsage, Tools: p.Tools, Hold: hold,
			Logprobs: p.Logprobs, MaxToolCalls: p.MaxToolCalls, NewID: h.o.NewID})
		return s, &iop.RunRequest{Input: in, Stream: x.Stream}, nil
	case RunMessages:
		in, p, e := anthropic.InputPolicy(x.Body, false, x.Unknown)
		if e != nil {
			return nil, nil, e
		}
		reportIgnored(x, &p.Ignored)
		s := &runSink[anthropic.Messages, *anthropic.Messages]{h: h, x: x, stream: x.Stream}
		s.enc.Init(anthropic.Options{Model: x.responseName(), ID: "msg_" + h.o.NewID(), Stream: x.Stream, Tools: p.Tools,
			MaxToolCalls: p.MaxToolCalls, Hold: hold, NewID: h.o.NewID, OmitThinking: p.OmitThinking})
		return s, &iop.RunRequest{Input: in, Stream: x.Stream}, nil
	case RunCountTokens:
		in, p, e := anthropic.InputPolicy(x.Body, true, x.Unknown)
		if e != nil {
			return nil, nil, e
		}
		reportIgnored(x, &p.Ignored)
		return &runSink[anthropic.Count, *anthropic.Count]{h: h, x: x}, &iop.RunRequest{Input: in}, nil
	case RunResponses:
		in, p, e := responses.InputPolicy(x.Body, x.Unknown)
		if e != nil {
			return nil, nil, e
		}
		reportIgnored(x, &p.Ignored)
		s := &runSink[responses.Encoder, *responses.Encoder]{h: h, x: x, stream: x.Stream}
		s.enc.Init(responses.Options{Model: x.responseName(), ID: "resp_" + h.o.NewID(), Created: h.o.Now().Unix(), Stream: x.Stream,
			Tools: p.Tools, MaxToolCalls: p.MaxToolCalls, Echo: p.Echo, Hold: hold, NewID: h.o.NewID, Namespaces: p.Namespaces})
		return s, &iop.RunRequest{Input: in, Stream: x.Stream}, nil
	case RunEmbeddings:
		in, b64, e := openai.EmbeddingsInput(x.Body)
		if e != nil {
			return nil, nil, e
		}
		s := &runSink[openai.Embeddings, *openai.Embeddings]{h: h, x: x}
		s.enc.Init(x.responseName(), b64)
		return s, &iop.RunRequest{Input: in, Operation: protocol.RunEmbeddings}, nil
	}
	return nil, nil, apisurface.BadRequest("", "%s has no run-path surface", x.Endpoint.Path)
}

// reportIgnored reports what the run path accepted without sending to
// the backend (surface.Ignored: unknown members under "report", tools the
// model is not offered): the response header surface.IgnoredHeader, the
// access line's ignored_fields and the metric
// iop_edge_ignored_fields_total{surface,field} (field: the table row,
// bounded). The header is set before any byte, so a failure answered
// later carries it too.
func reportIgnored(x *Exchange, ig *apisurface.Ignored) {
	if ig.Total == 0 {
		return
	}
	v := ig.Header()
	x.out.W.Header().Set(apisurface.IgnoredHeader, v)
	rec := &x.Acc.Rec
	rec.IgnoredFields = v
	rec.IgnoredRows = rec.IgnoredRows[:0]
	for _, f := range ig.Fields {
		rec.IgnoredRows = append(rec.IgnoredRows, f.Row)
	}
}

// credential returns the lease and binding of x's current provider lease
// (SPEC C2: after provider selection, for exactly that node, provider and
// target; a re-dispatch asks again for the new provider). ok is false when
// no lease could be issued: it answered 502 and nothing is sent to the
// node, so nothing reaches the upstream. The edge never falls back to
// another slot (SPEC C6): the slot is the route's.
func (h *Engine) credential(x *Exchange) (l *iop.CredentialLease, b *iop.CredentialLeaseBinding, ok bool) {
	if h.o.Credentials == nil {
		return nil, nil, true
	}
	pl := x.lease
	l, b, err := h.o.Credentials.Lease(creds.Request{Principal: x.Principal, Model: x.Model,
		Node: pl.Node, Provider: pl.Provider, Target: pl.Target})
	if err != nil {
		h.log.Warn("credential lease not issued", "model", x.Model, "node", pl.Node, "provider", pl.Provider, "err", err)
		reply.WriteError(x.out.W, x.Endpoint.Surface, reply.BadGateway("credential_unavailable",
			"the edge could not issue a credential for the selected provider"))
		return nil, nil, false
	}
	return l, b, true
}
