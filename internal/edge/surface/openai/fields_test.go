package openai

import (
	"testing"

	st "iop/internal/edge/surface/surfacetest"
)

// Issue 14: every field the chat parser knows has exactly one row in
// ChatFields; a field added to chatRequest without a row fails here.
func TestChatFieldTableComplete(t *testing.T) {
	st.CheckFieldTable(t, ChatRequestFields(), ChatFields)
}
