package transport

import (
	"slices"
	"unicode/utf8"

	iop "iop/proto/gen/iop"
)

// What one node may put into the Edge (the "what a compromised node can
// do" bounds). A frame is already bounded by its size cap (64 KiB before
// ready, 16 MiB after; internal/wire), but a field that travels on from
// here — an error text into a client's body, the access log and
// /status's recent errors, token usage into the access log and metrics, a
// reason into a log line — is bounded again, at this ingress, before the
// HTTP layer, the logs or the metrics see it: the Edge's own limits do not
// depend on each consumer remembering to apply them. Content a client
// asked for (deltas, the complete text, tool calls, tunnel bodies) is not
// touched: it is the answer, bounded by the frame cap.
const (
	// maxErrorText bounds error texts and reasons, in bytes: ERROR
	// events' and frames' error, a command's error, a refresh's reason.
	// A node's own upstream error messages are at most 1 KiB.
	maxErrorText = 2048
	// maxShortText bounds identifiers and codes, in bytes: failure_code,
	// adapter, target, finish_reason, param, ExecutionFailure's strings,
	// error metadata, node ids, the version, command results.
	maxShortText = 256
	// MaxUsageTokens bounds each token count of a Usage; a Usage with a
	// count outside 0..MaxUsageTokens is dropped as unreported. 2^24
	// (16.7 M) tokens exceed any model's context and the 8 MiB request
	// body cap several times over.
	MaxUsageTokens = 1 << 24
	// maxMapEntries bounds error metadata and command results (the
	// allow-listed keys are a handful, SPEC H3, N1).
	maxMapEntries = 32
	// maxTunnelHeaders, maxHeaderValue: a tunnel's RESPONSE_START headers
	// and each value's bytes (net/http's own client reads 1 MiB of head;
	// the node caps the upstream's at 1 MiB too).
	maxTunnelHeaders = 128
	maxHeaderValue   = 8 << 10
)

// truncatedMark ends a text that boundText cut.
const truncatedMark = "…[truncated]"

// boundText returns s cut to at most max bytes (including the mark), at a
// UTF-8 boundary, with truncatedMark appended when it was cut.
func boundText(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max - len(truncatedMark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + truncatedMark
}

// boundField bounds *s to max, reporting whether it changed.
func boundField(s *string, max int) bool {
	if len(*s) <= max {
		return false
	}
	*s = boundText(*s, max)
	return true
}

// boundIngress applies the bounds above to one envelope from a node, in
// place, before the read loop routes it. It reports which kind of field
// it changed ("" when none): the caller logs that, rate limited. On the
// hot path (a DELTA event, a BODY frame) it costs a few length checks.
func boundIngress(env *iop.Envelope) (changed string) {
	note := func(what string, did bool) {
		if did && changed == "" {
			changed = what
		}
	}
	switch k := env.Kind.(type) {
	case *iop.Envelope_RunEvent:
		ev := k.RunEvent
		if ev == nil {
			return ""
		}
		note("error text", boundField(&ev.Error, maxErrorText))
		note("identifiers", boundFields(maxShortText, &ev.FailureCode, &ev.Adapter, &ev.Target, &ev.FinishReason, &ev.Param))
		note("usage", boundUsage(&ev.Usage))
		note("failure", boundFailure(ev.Failure))
		if ev.Type == iop.RunEventType_RUN_EVENT_ERROR {
			note("error metadata", boundMap(&ev.Metadata))
		}
	case *iop.Envelope_TunnelFrame:
		f := k.TunnelFrame
		if f == nil {
			return ""
		}
		note("error text", boundField(&f.Error, maxErrorText))
		note("identifiers", boundFields(maxShortText, &f.FailureCode, &f.Adapter, &f.Target))
		note("usage", boundUsage(&f.Usage))
		note("failure", boundFailure(f.Failure))
		note("error metadata", boundMap(&f.Metadata))
		note("headers", boundHeaders(&f.Headers))
	case *iop.Envelope_CommandResponse:
		r := k.CommandResponse
		if r == nil {
			return ""
		}
		note("error text", boundField(&r.Error, maxErrorText))
		note("command result", boundMap(&r.Result))
	case *iop.Envelope_RefreshResponse:
		if r := k.RefreshResponse; r != nil {
			note("error text", boundField(&r.Reason, maxErrorText))
		}
	case *iop.Envelope_ConfigRejected:
		if r := k.ConfigRejected; r != nil {
			note("error text", boundField(&r.Reason, maxErrorText))
		}
	case *iop.Envelope_RegisterRequest:
		if r := k.RegisterRequest; r != nil {
			note("identifiers", boundFields(maxShortText, &r.NodeId, &r.Version))
		}
	case *iop.Envelope_ReadyRequest:
		if r := k.ReadyRequest; r != nil {
			note("identifiers", boundField(&r.NodeId, maxShortText))
		}
	}
	return changed
}

// boundUsage drops a Usage with a token count outside 0..MaxUsageTokens.
func boundUsage(u **iop.Usage) bool {
	v := *u
	if v == nil {
		return false
	}
	ok := func(n int64) bool { return n >= 0 && n <= MaxUsageTokens }
	if ok(v.PromptTokens) && ok(v.CompletionTokens) && ok(v.TotalTokens) {
		return false
	}
	*u = nil
	return true
}

// boundFields bounds each of ss to max, reporting whether any changed.
func boundFields(max int, ss ...*string) bool {
	changed := false
	for _, s := range ss {
		if boundField(s, max) {
			changed = true
		}
	}
	return changed
}

func boundFailure(f *iop.ExecutionFailure) bool {
	if f == nil {
		return false
	}
	return boundFields(maxShortText, &f.Code, &f.ProviderHealth, &f.LivenessClassification, &f.NodeRunId, &f.AttemptId,
		&f.Fence, &f.Adapter, &f.Target, &f.ProviderId, &f.RecoveryHandoff)
}

// boundMap keeps at most maxMapEntries entries (those with the smallest
// keys, so the choice does not depend on map order) and bounds each key
// and value to maxShortText.
func boundMap(m *map[string]string) bool {
	if len(*m) == 0 {
		return false
	}
	changed := false
	if len(*m) > maxMapEntries {
		keys := make([]string, 0, len(*m))
		for k := range *m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys[maxMapEntries:] {
			delete(*m, k)
		}
		changed = true
	}
	for k, v := range *m {
		if len(k) > maxShortText {
			delete(*m, k)
			changed = true
			continue
		}
		if len(v) > maxShortText {
			(*m)[k] = boundText(v, maxShortText)
			changed = true
		}
	}
	return changed
}

// boundHeaders keeps the first maxTunnelHeaders headers and drops one whose
// name is over maxShortText or whose value is over maxHeaderValue (a cut
// header value would be wrong, not shorter).
func boundHeaders(hs *[]*iop.Header) bool {
	if len(*hs) == 0 {
		return false
	}
	changed := false
	if len(*hs) > maxTunnelHeaders {
		*hs = (*hs)[:maxTunnelHeaders]
		changed = true
	}
	out := (*hs)[:0]
	for _, h := range *hs {
		if h == nil || len(h.Name) > maxShortText || len(h.Value) > maxHeaderValue {
			changed = true
			continue
		}
		out = append(out, h)
	}
	*hs = out
	return changed
}

// boundList returns at most n entries of l, each at most max bytes (a
// longer one is dropped).
func boundList(l []string, n, max int) []string {
	out := make([]string, 0, min(len(l), n))
	for _, s := range l {
		if len(out) == n {
			break
		}
		if len(s) <= max {
			out = append(out, s)
		}
	}
	return out
}
