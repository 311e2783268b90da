package pool

import "testing"

// localOnly is r as asked by a local-only key (SPEC V3).
func localOnly(r Request) Request {
	r.LocalOnly = true
	return r
}

// remoteConfig is baseConfig with tiny's llama route remote (a hosted
// API) and big served only by it.
func remoteConfig() Config {
	cfg := baseConfig()
	cfg.Groups[0].Candidates[1].Remote = true
	cfg.Groups[1].Candidates[0].Remote = true
	return cfg
}

// TestLocalOnly: a local-only request is never given a remote route: it
// waits for a local one while the remote one is free, a re-dispatch after
// the local one gets ErrAllTried, a group served only remotely answers
// NoCandidateError saying so; other requests take the remote route as
// before (SPEC V3).
func TestLocalOnly(t *testing.T) {
	rows := []struct {
		name string
		run  func(h *harness)
	}{
		{"V3 the local route, never the free remote one", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", localOnly(chat("tiny", 0)))
			h.wantLease("a", kOllama)
			h.acq("b", localOnly(chat("tiny", 0)))
			h.wantLease("b", kOllama)
			h.acq("c", localOnly(chat("tiny", 0))) // ollama full, llama (remote) free: waits
			h.wantQueued("c")
			h.acq("d", chat("tiny", 0)) // another key takes the remote route
			h.wantLease("d", kLlama)
		}},
		{"V3 a re-dispatch after the local route: ErrAllTried, never the remote one", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", localOnly(tried(chat("tiny", 0), kOllama)))
			h.wantErr("a", ErrAllTried, "tiny")
			h.wantStats(0, 0)
		}},
		{"V3 a group served only remotely: no candidate for the key", func(h *harness) {
			h.ready("gpu-2", 1, true)
			h.acq("a", localOnly(chat("big", 0)))
			h.wantErr("a", ErrNoCandidate, "local-only")
			h.acq("b", chat("big", 0))
			h.wantLease("b", kLlama)
		}},
		{"V3 a queued local-only request keeps its narrowing across a reload", func(h *harness) {
			h.ready("gpu-1", 1, true)
			h.ready("gpu-2", 1, true)
			h.acq("a", localOnly(chat("tiny", 0)))
			h.acq("b", localOnly(chat("tiny", 0)))
			h.acq("c", localOnly(chat("tiny", 0)))
			h.wantQueued("c")
			h.reconfigure(remoteConfig())
			h.wantQueued("c")
		}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			r.run(newHarness(t, remoteConfig()))
		})
	}
}
