package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"iop/internal/protocol"
	"iop/internal/wire/direct"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// refreshNoChange is a refresh answer's note for a payload already applied.
const refreshNoChange = "unchanged revision"

// dispatch routes one inbound envelope on the read loop: one type switch
// over the closed set, unknown kinds logged and ignored (SPEC W5). It never
// blocks on I/O; work that can take time gets its own goroutine.
func (s *session) dispatch(env *iop.Envelope) {
	switch k := env.Kind.(type) {
	case *iop.Envelope_Ping:
		s.sendFromReader(&iop.Envelope{Kind: &iop.Envelope_Pong{Pong: &iop.HeartbeatPong{
			SentUnixMs: time.Now().UnixMilli(), Nonce: k.Ping.GetNonce(),
		}}}, false)
	case *iop.Envelope_Pong:
		// Liveness only: the read deadline already moved.
	case *iop.Envelope_RunRequest:
		s.startRun(env.GetRunId(), k.RunRequest)
	case *iop.Envelope_TunnelRequest:
		s.startTunnel(env.GetRunId(), k.TunnelRequest)
	case *iop.Envelope_CancelRequest:
		s.cancelRun(env.GetRunId(), k.CancelRequest.GetReason())
	case *iop.Envelope_CommandRequest:
		s.startCommand(env.GetRequestId(), k.CommandRequest)
	case *iop.Envelope_RefreshRequest:
		s.refresh(env.GetRequestId(), k.RefreshRequest)
	case *iop.Envelope_RenewResponse:
		s.fleetFrame(k.RenewResponse) // SPEC J5
	default:
		s.log.Warn("ignoring envelope not expected by a ready node", "kind", fmt.Sprintf("%T", env.Kind))
	}
}

// acquire claims the current Executor for one piece of work.
func (s *session) acquire() *execRef {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.exec.refs++
	return s.exec
}

// release returns a claim; the last release of a replaced Executor closes it.
func (s *session) release(r *execRef) {
	s.mu.Lock()
	r.refs--
	closeNow := r.retired && r.refs == 0
	s.mu.Unlock()
	if closeNow {
		r.ex.Close()
	}
}

// claimRun registers run_id with a fresh context under the session context
// (SPEC E6) and the current Executor. ok is false for an empty or duplicate
// run_id.
func (s *session) claimRun(runID string) (ctx context.Context, ex *execRef, ok bool) {
	if runID == "" {
		return nil, nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.runs[runID]; dup {
		return nil, nil, false
	}
	ctx, cancel := context.WithCancelCause(s.ctx)
	s.runs[runID] = cancel
	s.exec.refs++
	s.work.Add(1)
	return ctx, s.exec, true
}

// finishRun drops run_id from the table, cancels its context and releases the
// Executor claim.
func (s *session) finishRun(runID string, ex *execRef) {
	s.mu.Lock()
	cancel := s.runs[runID]
	delete(s.runs, runID)
	if len(s.runs) == 0 && s.idle != nil {
		close(s.idle) // a drain waits for this
		s.idle = nil
	}
	s.mu.Unlock()
	if cancel != nil {
		cancel(nil)
	}
	s.release(ex)
	s.work.Done()
}

// startRun starts one normalized run on its own goroutine (SPEC E1–E6). A
// duplicate run_id gets an error terminal and does not disturb the first.
// Its end is logged once ("run done", with the Edge's request_id).
func (s *session) startRun(runID string, req *iop.RunRequest) {
	ctx, ex, ok := s.claimRun(runID)
	if !ok {
		s.rejectDuplicate(runID, req, false)
		return
	}
	s.workers.Go(func() {
		defer s.finishRun(runID, ex)
		start := time.Now()
		var end string // the terminal's type or failure code; emits never overlap
		ex.ex.Run(ctx, runID, req, func(ev *iop.RunEvent) {
			s.stampObservation(ev.GetFailure(), &ev.Metadata)
			if isRunTerminal(ev) {
				end = runOutcome(ev)
			}
			s.sendFromWork(&iop.Envelope{RunId: runID, Kind: &iop.Envelope_RunEvent{RunEvent: ev}}, runEventMode(ev))
		})
		s.logDone("run", runID, req.GetRequestId(), req.GetAdapter(), req.GetTarget(), end, start)
	})
}

// startTunnel starts one provider raw tunnel on its own goroutine (SPEC
// T1–T3); its end is logged as startRun's.
func (s *session) startTunnel(runID string, req *iop.ProviderTunnelRequest) {
	ctx, ex, ok := s.claimRun(runID)
	if !ok {
		s.rejectDuplicate(runID, req, true)
		return
	}
	streaming := req.GetStream()
	s.workers.Go(func() {
		defer s.finishRun(runID, ex)
		start := time.Now()
		var end string
		var status int32
		ex.ex.Tunnel(ctx, runID, req, func(fr *iop.ProviderTunnelFrame) {
			s.stampObservation(fr.GetFailure(), &fr.Metadata)
			switch fr.GetKind() {
			case iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START:
				status = fr.GetStatus()
				if streamingResponse(fr.GetHeaders()) {
					streaming = true
				}
			case iop.TunnelFrameKind_TUNNEL_FRAME_END:
				end = "end"
			case iop.TunnelFrameKind_TUNNEL_FRAME_ERROR:
				end = "error:" + fr.GetFailureCode()
			}
			s.sendFromWork(&iop.Envelope{RunId: runID, Kind: &iop.Envelope_TunnelFrame{TunnelFrame: fr}},
				tunnelFrameMode(fr, streaming))
		})
		s.logDone("tunnel", runID, req.GetRequestId(), req.GetAdapter(), req.GetTarget(), end, start, slog.Int("upstream_status", int(status)))
	})
}

// logDone writes the one Info line per run or tunnel ("run done"): kind,
// run_id, the Edge's request_id, adapter, target, how it ended (complete,
// cancelled, end, or error:<failure_code>) and its duration. Never a
// payload or a credential.
func (s *session) logDone(kind, runID, requestID, adapter, target, end string, start time.Time, extra ...slog.Attr) {
	attrs := append([]slog.Attr{
		slog.String("kind", kind), slog.String("run_id", runID), slog.String("request_id", requestID),
		slog.String("adapter", adapter), slog.String("target", target), slog.String("end", end),
		slog.Int64("duration_ms", time.Since(start).Milliseconds()),
	}, extra...)
	s.log.LogAttrs(context.Background(), slog.LevelInfo, "run done", attrs...)
}

func isRunTerminal(ev *iop.RunEvent) bool {
	switch ev.GetType() {
	case iop.RunEventType_RUN_EVENT_COMPLETE, iop.RunEventType_RUN_EVENT_ERROR, iop.RunEventType_RUN_EVENT_CANCELLED:
		return true
	}
	return false
}

func runOutcome(ev *iop.RunEvent) string {
	switch ev.GetType() {
	case iop.RunEventType_RUN_EVENT_COMPLETE:
		return "complete"
	case iop.RunEventType_RUN_EVENT_CANCELLED:
		return "cancelled"
	}
	return "error:" + ev.GetFailureCode()
}

// runEventMode is when a run event must reach the Edge: a START may wait for
// the first DELTA or the terminal (the Edge writes nothing for it alone);
// every other event is flushed at once.
func runEventMode(ev *iop.RunEvent) direct.Mode {
	if ev.GetType() == iop.RunEventType_RUN_EVENT_START {
		return direct.Hold
	}
	return direct.Flush
}

// tunnelFrameMode is when a tunnel frame must reach the Edge (SPEC T2: a
// stream is never buffered). Terminals and a stream's BODY frames are
// flushed at once; RESPONSE_START and USAGE may wait for the next frame (the
// Edge keeps the status and headers until the first BODY and only observes
// USAGE), and so may a plain body's BODY frames, which the Edge holds until
// END anyway. A held frame waits at most direct.DefaultHoldMax.
func tunnelFrameMode(fr *iop.ProviderTunnelFrame, streaming bool) direct.Mode {
	switch fr.GetKind() {
	case iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START, iop.TunnelFrameKind_TUNNEL_FRAME_USAGE:
		return direct.Hold
	case iop.TunnelFrameKind_TUNNEL_FRAME_BODY:
		if !streaming {
			return direct.Hold
		}
	}
	return direct.Flush
}

// streamingResponse reports whether response headers announce a stream the
// Edge relays frame by frame: SSE or NDJSON (JSON Lines).
func streamingResponse(hs []*iop.Header) bool {
	for _, h := range hs {
		if !strings.EqualFold(h.GetName(), "Content-Type") {
			continue
		}
		ct := strings.ToLower(strings.TrimSpace(h.GetValue()))
		return strings.HasPrefix(ct, "text/event-stream") || strings.HasPrefix(ct, "application/x-ndjson") ||
			strings.HasPrefix(ct, "application/jsonl")
	}
	return false
}

// rejectDuplicate answers a RunRequest (tunnel false) or a
// ProviderTunnelRequest whose run_id cannot start (claimRun, SPEC E5): an
// empty one is logged and ignored; a duplicate gets an ERROR terminal
// invalid_request of seq 1 with req's adapter and target, and the run of
// that id goes on untouched.
func (s *session) rejectDuplicate(runID string, req interface {
	GetAdapter() string
	GetTarget() string
}, tunnel bool) {
	kind, what := "RunRequest", "duplicate"
	if tunnel {
		kind, what = "ProviderTunnelRequest", "duplicate tunnel"
	}
	if runID == "" {
		s.log.Warn("ignoring " + kind + " without run_id")
		return
	}
	s.log.Warn("duplicate run_id; rejecting the "+what, "run_id", runID)
	msg := "duplicate run_id " + strconv.Quote(runID)
	code := protocol.CodeInvalidRequest.String()
	env := &iop.Envelope{RunId: runID}
	if tunnel {
		env.Kind = &iop.Envelope_TunnelFrame{TunnelFrame: &iop.ProviderTunnelFrame{Seq: 1, Kind: iop.TunnelFrameKind_TUNNEL_FRAME_ERROR,
			Error: msg, FailureCode: code, Message: msg, Adapter: req.GetAdapter(), Target: req.GetTarget()}}
	} else {
		env.Kind = &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{Seq: 1, Type: iop.RunEventType_RUN_EVENT_ERROR,
			Error: msg, FailureCode: code, Message: msg, Adapter: req.GetAdapter(), Target: req.GetTarget()}}
	}
	s.sendFromReader(env, true)
}

// stampObservation gives a stall terminal the next health observation
// sequence of this connection (SPEC H5) unless the Executor already set one:
// ExecutionFailure.health_observation_seq and the allow-listed metadata key
// of the same name (SPEC H3).
func (s *session) stampObservation(f *iop.ExecutionFailure, meta *map[string]string) {
	if f == nil || f.GetHealthObservationSeq() != 0 {
		return
	}
	f.HealthObservationSeq = s.obsSeq.Add(1)
	if *meta == nil {
		*meta = make(map[string]string, 1)
	}
	(*meta)[protocol.MetaObservationSeq] = strconv.FormatUint(f.HealthObservationSeq, 10)
}

// cancelRun cancels one run or tunnel (SPEC E5, T3); unknown ids are ignored.
func (s *session) cancelRun(runID, reason string) {
	s.mu.Lock()
	cancel := s.runs[runID]
	s.mu.Unlock()
	if cancel == nil {
		s.log.Debug("cancel for unknown run_id ignored (E5)", "run_id", runID)
		return
	}
	s.log.Info("run cancelled by edge", "run_id", runID, "reason", reason)
	cancel(nil)
}

// startCommand answers a NodeCommandRequest on its own goroutine (the
// CAPABILITIES probe takes up to Timeouts.Probe).
func (s *session) startCommand(requestID string, req *iop.NodeCommandRequest) {
	ex := s.acquire()
	s.work.Add(1)
	go func() {
		defer s.work.Done()
		defer s.release(ex)
		resp := s.command(ex, req)
		s.sendFromWork(&iop.Envelope{RequestId: requestID, Kind: &iop.Envelope_CommandResponse{CommandResponse: resp}}, direct.Flush)
	}()
}

// command builds the response to one command (SPEC N1).
func (s *session) command(ex *execRef, req *iop.NodeCommandRequest) *iop.NodeCommandResponse {
	switch req.GetType() {
	case iop.NodeCommandType_NODE_COMMAND_CAPABILITIES:
		return s.capabilities(ex, req)
	case iop.NodeCommandType_NODE_COMMAND_TRANSPORT:
		return s.transportFacts(ex)
	case iop.NodeCommandType_NODE_COMMAND_PROVIDER_LIFECYCLE:
		return lifecycle(ex.cfg)
	default:
		return &iop.NodeCommandResponse{Error: "unknown command type " + req.GetType().String()}
	}
}

// capabilities resolves the adapter instance, runs one bounded exact-target
// probe and returns the recovery evidence with the next observation sequence
// of this connection (SPEC H5, H10). An unresolvable instance or an empty
// target is not probed and takes no sequence number.
func (s *session) capabilities(ex *execRef, req *iop.NodeCommandRequest) *iop.NodeCommandResponse {
	inst, ok := resolveInstance(ex.cfg, req.GetAdapter())
	if !ok {
		return &iop.NodeCommandResponse{Error: protocol.CodeUnknownAdapter.String() + ": no adapter instance " + strconv.Quote(req.GetAdapter())}
	}
	if req.GetTarget() == "" {
		return &iop.NodeCommandResponse{Error: "invalid_request: CAPABILITIES needs a target"}
	}
	key := instanceName(inst)
	ctx, cancel := context.WithTimeout(s.ctx, s.o.Timeouts.Probe)
	status := ex.ex.Probe(ctx, key, req.GetTarget(), req.GetCredentialLease(), req.GetCredentialBinding())
	cancel()
	switch status {
	case protocol.HealthAvailable, protocol.HealthUnavailable, protocol.HealthUnknown:
	default:
		status = protocol.HealthUnknown // fail closed
	}
	seq := s.obsSeq.Add(1)
	return &iop.NodeCommandResponse{Ok: true, Result: map[string]string{
		protocol.KeyAdapterKey: key,
		protocol.KeyTarget:     req.GetTarget(),
		protocol.KeyStatus:     status,
		protocol.KeySeq:        strconv.FormatUint(seq, 10),
		protocol.KeyAdapter:    req.GetAdapter(),
		protocol.KeyInstance:   inst.GetType() + "/" + key,
	}}
}

// transportFacts reports basic session facts: no address, certificate or
// secret (SPEC N3, P4).
func (s *session) transportFacts(ex *execRef) *iop.NodeCommandResponse {
	s.mu.Lock()
	active := len(s.runs)
	s.mu.Unlock()
	return &iop.NodeCommandResponse{Ok: true, Result: map[string]string{
		"node_id":               s.o.NodeID,
		"ready":                 "true",
		"protocol":              "tls1.3",
		"ready_since_unix_ms":   strconv.FormatInt(s.readySince.UnixMilli(), 10),
		"heartbeat_interval_ms": strconv.FormatInt(s.heartbeatInterval().Milliseconds(), 10),
		"heartbeat_timeout_ms":  strconv.FormatInt(s.heartbeatTimeout().Milliseconds(), 10),
		"frames_received":       strconv.FormatUint(s.framesIn.Load(), 10),
		"frames_sent":           strconv.FormatUint(s.framesOut.Load(), 10),
		"pongs_dropped":         strconv.FormatUint(s.pongsDropped.Load(), 10),
		"send_queue_len":        strconv.Itoa(s.w.Queued()),
		"send_queue_cap":        strconv.Itoa(s.w.QueueCap()),
		"active_runs":           strconv.Itoa(active),
		"config_revision":       ex.cfg.GetRevision(),
	}}
}

// lifecycle lists the adapter instances of the applied config: "instances"
// is their comma-separated sorted names, and "<name>.type", "<name>.category",
// "<name>.capacity", "<name>.long_capacity" and "<name>.state" describe each.
func lifecycle(cfg *iop.NodeConfigPayload) *iop.NodeCommandResponse {
	res := map[string]string{"config_revision": cfg.GetRevision()}
	var names []string
	for _, a := range cfg.GetAdapters() {
		n := instanceName(a)
		names = append(names, n)
		res[n+".type"] = a.GetType()
		res[n+".category"] = a.GetCategory()
		res[n+".capacity"] = strconv.Itoa(int(a.GetCapacity()))
		res[n+".long_capacity"] = strconv.Itoa(int(a.GetLongCapacity()))
		res[n+".state"] = "started"
	}
	sort.Strings(names)
	res["instances"] = strings.Join(names, ",")
	return &iop.NodeCommandResponse{Ok: true, Result: res}
}

// instanceName is an adapter instance's id: its name, or its type for the
// legacy unnamed instance (SPEC E1).
func instanceName(a *iop.AdapterConfig) string {
	if a.GetName() != "" {
		return a.GetName()
	}
	return a.GetType()
}

// resolveInstance finds the instance a command names; an empty name means the
// only configured instance (SPEC E1).
func resolveInstance(cfg *iop.NodeConfigPayload, name string) (*iop.AdapterConfig, bool) {
	ads := cfg.GetAdapters()
	if name == "" {
		if len(ads) == 1 {
			return ads[0], true
		}
		return nil, false
	}
	for _, a := range ads {
		if instanceName(a) == name {
			return a, true
		}
	}
	return nil, false
}

// refresh applies a pushed NodeConfigPayload (SPEC N2) on the read loop, so
// refreshes apply in arrival order. The same revision (or, without revisions,
// an equal payload) is APPLIED without change; a payload the factory rejects
// is FAILED — RESTART_REQUIRED when the factory says only a restart could
// apply it (ErrRestartRequired) — and the previous Executor stays, either
// way; otherwise new work goes to the
// new Executor while running work finishes on the old one, which is closed
// after its last run.
func (s *session) refresh(requestID string, req *iop.NodeConfigRefreshRequest) {
	respond := func(st iop.RefreshStatus, reason string) {
		s.sendFromReader(&iop.Envelope{RequestId: requestID, Kind: &iop.Envelope_RefreshResponse{
			RefreshResponse: &iop.NodeConfigRefreshResponse{Status: st, Reason: reason},
		}}, true)
	}
	cfg := req.GetConfig()
	if cfg == nil {
		respond(iop.RefreshStatus_REFRESH_FAILED, "refresh carries no config")
		return
	}
	s.mu.Lock()
	cur := s.exec.cfg
	s.mu.Unlock()
	if sameConfig(cur, cfg) {
		respond(iop.RefreshStatus_REFRESH_APPLIED, refreshNoChange)
		return
	}
	e, err := s.o.NewExecutor(cfg)
	if errors.Is(err, ErrRestartRequired) {
		s.log.Warn("config refresh needs a restart of the node; keeping the previous config", "revision", cfg.GetRevision(), "err", err)
		respond(iop.RefreshStatus_REFRESH_RESTART_REQUIRED, err.Error())
		return
	}
	if err != nil {
		s.log.Warn("config refresh failed; keeping the previous config", "revision", cfg.GetRevision(), "err", err)
		respond(iop.RefreshStatus_REFRESH_FAILED, err.Error())
		return
	}
	s.mu.Lock()
	old := s.exec
	s.exec = &execRef{ex: e, cfg: cfg}
	old.retired = true
	closeOld := old.refs == 0
	s.mu.Unlock()
	if closeOld {
		old.ex.Close()
	}
	s.setHeartbeat(cfg.GetRuntime())
	s.kickDiscovery() // SPEC D1: the adapters may have changed
	s.kickResidency() // SPEC U6: so may what they report
	s.log.Info("config refreshed", "revision", cfg.GetRevision(), "adapters", len(cfg.GetAdapters()))
	respond(iop.RefreshStatus_REFRESH_APPLIED, "")
}

func sameConfig(a, b *iop.NodeConfigPayload) bool {
	if a.GetRevision() != "" || b.GetRevision() != "" {
		return a.GetRevision() == b.GetRevision()
	}
	return proto.Equal(a, b)
}
