package api

import (
	"testing"

	st "iop/internal/edge/surface/surfacetest"
	iop "iop/proto/gen/iop"
)

// Short names for the shared run-event constructors and response checkers
// (internal/edge/surface/surfacetest).

func evStart() *iop.RunEvent                     { return st.Start() }
func evDelta(seq uint64, s string) *iop.RunEvent { return st.Delta(seq, s) }
func evError(seq uint64, code, msg string) *iop.RunEvent {
	return st.Error(seq, code, msg)
}
func evComplete(seq uint64, content, finish string, u *iop.Usage, meta map[string]string) *iop.RunEvent {
	return st.Complete(seq, content, finish, u, meta)
}
func usage(p, c int64) *iop.Usage { return st.Usage(p, c) }

func checkCompletion(t *testing.T, body []byte, wantCalls int, wantFinish string) {
	t.Helper()
	st.CheckCompletion(t, body, wantCalls, wantFinish)
}

func checkChatStream(t *testing.T, body []byte, includeUsage bool, wantCalls int, wantFinish string, wantError bool) {
	t.Helper()
	st.CheckChatStream(t, body, includeUsage, wantCalls, wantFinish, wantError)
}
