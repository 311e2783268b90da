package api

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"iop/internal/edge/exchange"
	"iop/internal/edge/keys"
	"iop/internal/edge/reply"
)

// The HTTP side of client API keys (docs/keys.md): a request's key was
// found by authenticate (auth.go); here it is admitted under its bounds
// in two steps — its requests in flight and request rate before the body
// is read (admitKey), its token budgets once the body says what it may
// cost (reserveKey) — every answer carries its rate-limit headers, and the
// request's end settles its tokens from the usage the backend reported
// (finishKey). The key itself is never logged, only its principal (SPEC
// P4).

// admitKey admits p's request under its requests in flight and request
// rate (K5) and returns ctx carrying its ticket, or answers 429 with
// Retry-After and the rate-limit headers and returns nil.
func (h *Handler) admitKey(ctx context.Context, w *reply.Recorder, r *http.Request, s reply.Surface, p *keys.Principal) context.Context {
	now := h.o.Now()
	t, ref := h.keys.Admit(p, now)
	if ref != nil {
		h.refuseKey(w, s, ref, now, func(e *reply.Error) { reject(w, r, s, e) })
		return nil
	}
	writeRateLimit(w.Header(), s, &t.RateLimit, now)
	return context.WithValue(ctx, ticketKey{}, t)
}

// reserveKey reserves the request's token estimate under its key's
// budgets (K5) once the body is read: the estimate is the body's bytes ÷
// 4 and its maximum completion (keys.Estimate). It reports false when it
// answered 429. Open mode: nothing to do.
func (h *Handler) reserveKey(x *exchange.Exchange, w *reply.Recorder) bool {
	t := ticketOf(x.Ctx)
	if t == nil {
		return true
	}
	now := h.o.Now()
	if ref := t.Reserve(keys.Estimate(len(x.Body), x.MaxTokens), now); ref != nil {
		h.refuseKey(w, x.Endpoint.Surface, ref, now, func(e *reply.Error) { reply.WriteError(w, x.Endpoint.Surface, e) })
		return false
	}
	writeRateLimit(w.Header(), x.Endpoint.Surface, &t.RateLimit, now)
	w.MinTokens = int64(len(x.Body) / 4) // the prompt's estimate; the tunnel adds what it relays
	return true
}

// refuseKey answers a refusal of the key's own bounds: 429 with
// Retry-After (rounded up to a second) and the rate-limit headers, in the
// surface's shape, through write.
func (h *Handler) refuseKey(w *reply.Recorder, s reply.Surface, ref *keys.Refusal, now time.Time, write func(*reply.Error)) {
	h.logRefusal(&h.lim.keyLog, "request refused: API key limit", slog.String("principal", ref.Principal),
		slog.String("limit", ref.Bound()))
	writeRateLimit(w.Header(), s, &ref.RateLimit, now)
	write(&reply.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limit_exceeded",
		RetryAfter: ref.RetryAfter, Message: "too many " + ref.What() + " (" + ref.Bound() + ") for this API key; retry later"})
}

// writeRateLimit sets the rate-limit headers of rl (K6): Anthropic's names
// on the Anthropic surface, OpenAI's on every other.
func writeRateLimit(h http.Header, s reply.Surface, rl *keys.RateLimit, now time.Time) {
	if s == reply.Anthropic {
		rl.WriteAnthropic(h, now)
		return
	}
	rl.WriteOpenAI(h)
}

// finishKey ends the request's ticket, if any, at the end of its
// handler (K5): the in-flight slot goes back and the token reservation
// is settled with the usage the backend reported (the latest report, as
// the access record holds it), or for an answer that reported none the
// larger of its estimate and what its relay showed it cost
// (Recorder.MinTokens).
func (h *Handler) finishKey(ctx context.Context, w *reply.Recorder) {
	t := ticketOf(ctx)
	if t == nil {
		return
	}
	rec := &w.Rec
	t.Finish(keys.Outcome{PromptTokens: rec.PromptTokens, CompletionTokens: rec.CompletionTokens, Reported: w.Reported(),
		Answered: w.Wrote() && rec.Status < 400, Relayed: w.MinTokens}, h.o.Now())
}
