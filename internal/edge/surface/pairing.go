package surface

import (
	"encoding/json"
	"slices"

	iop "iop/proto/gen/iop"
)

// Terms name a surface's tool call and tool result in CheckToolPairing's
// errors: {"tool call", "tool message"} for chat, {"tool_use",
// "tool_result"} for Messages, {"function_call", "function_call_output"}
// for Responses.
type Terms struct{ Call, Result string }

// CheckToolPairing checks the normalized conversation's tool round trips
// as OpenAI's and Anthropic's APIs do: every tool result answers a call of
// the assistant message right before it (results may follow one another),
// and every call of an assistant message is answered before the next
// message that is not a result. A result for an unknown call, or a call
// left without its result, is a 400 naming field and the call id: the
// backend would otherwise get a conversation it cannot make sense of
// while the client gets a 200. It allocates only for conversations with
// tool calls.
func CheckToolPairing(field string, t Terms, msgs []*iop.ChatMessage) *Error {
	var pending []string // the last assistant message's unanswered call ids
	for _, m := range msgs {
		if m.Role == "tool" {
			i := slices.Index(pending, m.ToolCallId)
			if i < 0 {
				return BadRequest(field, "%s: the %s for call id %q answers no %s of the assistant message before it", field, t.Result, m.ToolCallId, t.Call)
			}
			pending = slices.Delete(pending, i, i+1)
			continue
		}
		if len(pending) > 0 {
			return BadRequest(field, "%s: the %s with id %q has no %s after it", field, t.Call, pending[0], t.Result)
		}
		if m.Role == "assistant" && len(m.ToolCallsJson) > 0 {
			var calls []struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(m.ToolCallsJson, &calls) != nil {
				return BadRequest(field, "%s: an assistant message's tool_calls must be an array of tool calls", field)
			}
			for _, c := range calls {
				if c.ID == "" {
					return BadRequest(field, "%s: every %s needs an id", field, t.Call)
				}
				pending = append(pending, c.ID)
			}
		}
	}
	if len(pending) > 0 {
		return BadRequest(field, "%s: the %s with id %q has no %s after it", field, t.Call, pending[0], t.Result)
	}
	return nil
}
