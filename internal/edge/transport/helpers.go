package transport

import (
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/registry"
	iop "iop/proto/gen/iop"
)

// Pure helpers of a session: its heartbeat settings from the config
// (heartbeatOf), whether registry effects make it ready (activates), and
// a run's cancel envelope.

type heartbeat struct{ interval, timeout time.Duration }

// heartbeatOf reads heartbeat.interval_ms and heartbeat.timeout_ms (SPEC L7).
func heartbeatOf(cfg *config.Config) heartbeat {
	hb := heartbeat{interval: config.DefaultHeartbeatIntervalMs * time.Millisecond,
		timeout: config.DefaultHeartbeatTimeoutMs * time.Millisecond}
	if cfg != nil && cfg.Heartbeat.IntervalMs > 0 {
		hb.interval = time.Duration(cfg.Heartbeat.IntervalMs) * time.Millisecond
	}
	if cfg != nil && cfg.Heartbeat.TimeoutMs > 0 {
		hb.timeout = time.Duration(cfg.Heartbeat.TimeoutMs) * time.Millisecond
	}
	return hb
}

// activates reports whether fx holds the first ready transition.
func activates(fx []registry.Effect) bool {
	for _, e := range fx {
		if e.Kind == registry.Activate {
			return true
		}
	}
	return false
}

func cancelEnvelope(runID, reason string) *iop.Envelope {
	return &iop.Envelope{RunId: runID, Kind: &iop.Envelope_CancelRequest{CancelRequest: &iop.CancelRequest{Reason: reason}}}
}
