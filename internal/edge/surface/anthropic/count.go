package anthropic

import (
	"net/http"
	"strconv"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"
)

// Count answers /v1/messages/count_tokens from a run of at most one token
// (Input with count set): {"input_tokens": N} with N the prompt token
// count the backend itself reported for that run (Ollama's
// prompt_eval_count). Without one the answer is a 400 saying so: a count
// is never guessed. The zero value is ready; not safe for concurrent use.
type Count struct{}

// Event implements surface.Encoder.
func (Count) Event(dst []byte, ev *iop.RunEvent) ([]byte, bool, *surface.Error) {
	if ev.Type != iop.RunEventType_RUN_EVENT_COMPLETE {
		return dst, false, nil
	}
	n := ev.GetUsage().GetPromptTokens()
	if n <= 0 {
		return dst, true, &surface.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "count_unavailable",
			Message: "count_tokens: this model's provider reported no token count for the request"}
	}
	dst = append(dst, `{"input_tokens":`...)
	dst = strconv.AppendInt(dst, n, 10)
	return append(dst, '}'), true, nil
}

// AppendError implements surface.Encoder; a count is never streamed.
func (Count) AppendError(dst []byte, e *surface.Error) []byte {
	return surface.AppendAnthropicError(dst, e)
}

var _ surface.Encoder = Count{}
