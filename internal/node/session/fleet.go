package session

import (
	"context"
	"errors"
	"slices"
	"time"

	"iop/internal/wire/direct"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// Certificate renewal and model discovery on a live session (SPEC J5, D1).
// Each is one goroutine of the session's work group, started by live and
// ended by the session's end; neither touches the read loop, which only
// hands a CertificateRenewResponse over (fleetFrame).

// CertRenewer renews the node's certificate in its files
// (internal/node/enroll.Renewer). The session calls it only while its
// payload says certificate_renewal.
type CertRenewer interface {
	// RenewAt is when the certificate in use is due.
	RenewAt() (time.Time, error)
	// NewRequest makes a new key and returns its CSR (DER).
	NewRequest() ([]byte, error)
	// Install checks the certificate (PEM) is for the last request's key
	// and writes key and certificate.
	Install(certPEM []byte) error
}

// ModelLister is what an Executor implements to serve discovery (the
// adapter Set does): the models one adapter's backend serves.
type ModelLister interface {
	ListModels(ctx context.Context, adapter string) ([]string, error)
}

// ResidencyReporter is what an Executor implements to report the
// residency of its managed adapters' models (the adapter Set does; SPEC
// U6).
type ResidencyReporter interface {
	Residency() []*iop.AdapterResidency
}

// ResidencyNotifier is what a ResidencyReporter implements to report
// changes as they happen (the adapter Set does): the channel is closed
// when the residency may have changed; take it before calling Residency.
type ResidencyNotifier interface {
	ResidencyChanged() <-chan struct{}
}

// ResidencyInterval spaces the reports whose only change is a model's
// in_flight count (a change of state goes at once), and is how often a
// session looks at an executor that is not a ResidencyNotifier.
const ResidencyInterval = 250 * time.Millisecond

// Renewal timing.
const (
	// RenewAnswerTimeout bounds the wait for the edge's answer.
	RenewAnswerTimeout = 30 * time.Second
	// renewRetryMin and renewRetryMax bound the wait before retrying a
	// failed renewal (it doubles from the one to the other).
	renewRetryMin = 2 * time.Second
	renewRetryMax = time.Minute
	// renewRecheck is how often a session whose payload does not ask for
	// renewal looks again (a refresh may turn it on).
	renewRecheck = time.Minute
)

// fleetState is the session's part of renewal and discovery.
type fleetState struct {
	renewResp chan *iop.CertificateRenewResponse // cap 1; filled by the read loop
	discover  chan struct{}                      // cap 1; a refresh asks for a poll now
	residency chan struct{}                      // cap 1; a refresh asks for a look now
}

func newFleetState() fleetState {
	return fleetState{renewResp: make(chan *iop.CertificateRenewResponse, 1), discover: make(chan struct{}, 1),
		residency: make(chan struct{}, 1)}
}

// startFleet starts the renewal and discovery goroutines of a live session.
func (s *session) startFleet() {
	s.work.Add(3)
	go func() {
		defer s.work.Done()
		s.renewLoop()
	}()
	go func() {
		defer s.work.Done()
		s.residencyLoop()
	}()
	go func() {
		defer s.work.Done()
		s.discoverLoop()
	}()
}

// fleetFrame takes a CertificateRenewResponse off the read loop (never
// blocking: an answer nobody waits for is dropped).
func (s *session) fleetFrame(r *iop.CertificateRenewResponse) {
	select {
	case s.fl.renewResp <- r:
	default:
	}
}

// kickDiscovery asks for a discovery poll now (after a refresh).
func (s *session) kickDiscovery() {
	select {
	case s.fl.discover <- struct{}{}:
	default:
	}
}

// renewalWanted reports whether the current payload asks for renewal.
func (s *session) renewalWanted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exec.cfg.GetRuntime().GetCertificateRenewal()
}

// sleep waits d or until the session ends; false when it ended.
func (s *session) sleep(d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-wake:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// renewLoop renews the certificate when it is due (SPEC J5): a new key
// and CSR, one CertificateRenewRequest, the answer installed. A failure
// is retried after 2 s, doubling up to a minute. The
// connection goes on with the certificate it has; the next handshake uses
// the new one.
func (s *session) renewLoop() {
	r := s.o.Renewer
	if r == nil {
		return
	}
	retry := renewRetryMin
	for {
		if !s.renewalWanted() {
			if !s.sleep(renewRecheck, nil) {
				return
			}
			continue
		}
		at, err := r.RenewAt()
		if err != nil {
			s.log.Error("certificate renewal: cannot read the certificate", "err", err)
			if !s.sleep(renewRetryMax, nil) {
				return
			}
			continue
		}
		if !s.sleep(time.Until(at), nil) {
			return
		}
		if err := s.renewOnce(r); err != nil {
			s.log.Warn("certificate renewal failed; retrying", "err", err, "retry_in", retry)
			if !s.sleep(retry, nil) {
				return
			}
			retry = min(2*retry, renewRetryMax)
			continue
		}
		retry = renewRetryMin
	}
}

// errRenewNoAnswer: the edge did not answer in RenewAnswerTimeout (an
// edge build without renewal ignores the request, SPEC W5).
var errRenewNoAnswer = errors.New("no answer from the edge (a build without certificate renewal?)")

func (s *session) renewOnce(r CertRenewer) error {
	csr, err := r.NewRequest()
	if err != nil {
		return err
	}
	select { // an answer to an earlier request that timed out
	case <-s.fl.renewResp:
	default:
	}
	s.sendFromWork(&iop.Envelope{Kind: &iop.Envelope_RenewRequest{RenewRequest: &iop.CertificateRenewRequest{Csr: csr}}}, direct.Flush)
	t := time.NewTimer(RenewAnswerTimeout)
	defer t.Stop()
	var resp *iop.CertificateRenewResponse
	select {
	case resp = <-s.fl.renewResp:
	case <-t.C:
		return errRenewNoAnswer
	case <-s.ctx.Done():
		return context.Cause(s.ctx)
	}
	if !resp.GetOk() {
		return errors.New("edge refused: " + resp.GetError())
	}
	if err := r.Install(resp.GetCertificatePem()); err != nil {
		return err
	}
	s.log.Info("certificate renewed", "not_after", time.UnixMilli(resp.GetNotAfterUnixMs()).UTC().Format(time.RFC3339))
	return nil
}

// discoverLoop lists the models of every adapter whose config asks for
// discovery (AdapterConfig.discovery_interval_ms) once the session is
// ready, again every interval and after each refresh, and sends a
// NodeModelsReport when anything changed since the last one sent (SPEC
// D1). A listing that fails reports the adapter's error (the edge keeps
// what it knew).
func (s *session) discoverLoop() {
	var last *iop.NodeModelsReport
	for {
		interval := s.discoverOnce(&last)
		if interval <= 0 {
			interval = renewRecheck // nothing to discover: look again after a while or a refresh
		}
		if !s.sleep(interval, s.fl.discover) {
			return
		}
	}
}

// discoverOnce polls once and returns the poll interval of the current
// config (0 when no adapter discovers).
func (s *session) discoverOnce(last **iop.NodeModelsReport) time.Duration {
	ex := s.acquire()
	defer s.release(ex)
	var interval time.Duration
	var names []string
	for _, a := range ex.cfg.GetAdapters() {
		if ms := a.GetDiscoveryIntervalMs(); ms > 0 {
			d := msDuration(ms, time.Minute)
			if interval == 0 || d < interval {
				interval = d
			}
			names = append(names, instanceName(a))
		}
	}
	lister, ok := ex.ex.(ModelLister)
	if len(names) == 0 || !ok {
		return interval
	}
	report := &iop.NodeModelsReport{}
	for _, n := range names {
		models, err := lister.ListModels(s.ctx, n)
		am := &iop.AdapterModels{Adapter: n, Models: models}
		if err != nil {
			am.Models, am.Error = nil, err.Error()
		}
		report.Adapters = append(report.Adapters, am)
	}
	if s.ctx.Err() != nil || (*last != nil && sameReport(*last, report)) {
		return interval
	}
	*last = report
	s.sendFromWork(&iop.Envelope{Kind: &iop.Envelope_ModelsReport{ModelsReport: report}}, direct.Flush)
	return interval
}

// sameReport compares two reports by adapter, models and whether each
// failed (not by the error's text, which may vary).
func sameReport(a, b *iop.NodeModelsReport) bool {
	return slices.EqualFunc(a.GetAdapters(), b.GetAdapters(), func(x, y *iop.AdapterModels) bool {
		return x.GetAdapter() == y.GetAdapter() && slices.Equal(x.GetModels(), y.GetModels()) &&
			(x.GetError() == "") == (y.GetError() == "")
	})
}

// residencyLoop sends a NodeResidencyReport once the session is ready and
// then whenever the residency of a managed or Ollama adapter's model
// changed (SPEC U6): a change of a model's state, load time or memory goes
// at once, one of in_flight alone at most every ResidencyInterval. It
// wakes when the executor says something changed (ResidencyNotifier),
// after a refresh, and, for an executor that cannot say, every
// ResidencyInterval. An executor without such adapters reports nothing.
func (s *session) residencyLoop() {
	var (
		last     *iop.NodeResidencyReport
		lastSent time.Time
	)
	poll := time.NewTimer(time.Hour)
	defer poll.Stop()
	for {
		ex := s.acquire()
		r, ok := ex.ex.(ResidencyReporter)
		var changed <-chan struct{}
		if n, ok := ex.ex.(ResidencyNotifier); ok {
			changed = n.ResidencyChanged()
		}
		var adapters []*iop.AdapterResidency
		if ok {
			adapters = r.Residency()
		}
		s.release(ex)
		wait := time.Hour
		if changed == nil {
			wait = ResidencyInterval
		}
		if len(adapters) > 0 || last != nil {
			report := &iop.NodeResidencyReport{Adapters: adapters}
			switch {
			case last != nil && proto.Equal(last, report):
			case last == nil || !sameStates(last, report) || time.Since(lastSent) >= ResidencyInterval:
				last, lastSent = report, time.Now()
				s.sendFromWork(&iop.Envelope{Kind: &iop.Envelope_ResidencyReport{ResidencyReport: report}}, direct.Flush)
			default: // only in_flight moved: after the interval
				wait = min(wait, ResidencyInterval-time.Since(lastSent))
			}
		}
		poll.Reset(max(wait, time.Millisecond))
		select {
		case <-changed:
		case <-s.fl.residency:
		case <-poll.C:
		case <-s.ctx.Done():
			return
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
	}
}

// sameStates compares two residency reports but for in_flight.
func sameStates(a, b *iop.NodeResidencyReport) bool {
	return slices.EqualFunc(a.GetAdapters(), b.GetAdapters(), func(x, y *iop.AdapterResidency) bool {
		return x.GetAdapter() == y.GetAdapter() && slices.EqualFunc(x.GetModels(), y.GetModels(), func(m, n *iop.ModelResidency) bool {
			return m.GetModel() == n.GetModel() && m.GetState() == n.GetState() && m.GetLoadMs() == n.GetLoadMs() &&
				m.GetMemoryMb() == n.GetMemoryMb()
		})
	})
}

// kickResidency asks for a residency look now (after a refresh: the
// executor, and so its adapters, may have changed).
func (s *session) kickResidency() {
	select {
	case s.fl.residency <- struct{}{}:
	default:
	}
}
