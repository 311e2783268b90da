package anthropic

import (
	"testing"

	st "iop/internal/edge/surface/surfacetest"
)

// Issue 14: every field the Messages parser knows has exactly one row in
// Fields; a field added to request without a row fails here.
func TestFieldTableComplete(t *testing.T) {
	st.CheckFieldTable(t, RequestFields(), Fields)
}
