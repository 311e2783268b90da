package keys

import (
	"context"
	"log/slog"
	"time"

	"iop/internal/edge/keystore"
	"iop/internal/ratelog"
)

// Persister writes a Registry's usage to the usage file (K7) at most once
// per interval, only while something changed, and once more when it
// stops: an Edge that crashes loses at most the last interval of counted
// usage (and the reservations of the requests then in flight), an Edge
// that stops cleanly nothing. It is the usage file's only writer.
type Persister struct {
	reg      *Registry
	path     string
	interval time.Duration
	now      func() time.Time
	log      *slog.Logger
	errLog   ratelog.Limiter
}

// NewPersister returns a Persister of reg to path every interval; now
// and log may be nil (time.Now, discard).
func NewPersister(reg *Registry, path string, interval time.Duration, now func() time.Time, log *slog.Logger) *Persister {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Persister{reg: reg, path: path, interval: interval, now: now, log: log}
}

// Restore reads the usage file into the registry (an Edge starting): a
// missing file is no usage yet; a malformed one is an error
// (keystore.ErrBadUsage), and the Edge does not start on it rather than
// forget budgets already spent.
func (p *Persister) Restore() error {
	u, err := keystore.LoadUsageOrEmpty(p.path)
	if err != nil {
		return err
	}
	p.reg.Restore(u, p.now())
	return nil
}

// Flush writes the usage file now if anything changed since the last
// write; a failed write is logged (at most a line a second) and retried
// at the next one.
func (p *Persister) Flush() {
	if !p.reg.Dirty() {
		return
	}
	if err := keystore.SaveUsage(p.path, p.reg.Usage(p.now())); err != nil {
		p.reg.dirty.Store(true)
		if ok, _ := p.errLog.Allow(p.now()); ok {
			p.log.Error("key usage not written; retrying", "file", p.path, "err", err)
		}
	}
}

// Run flushes every interval until ctx is done, then flushes once more.
func (p *Persister) Run(ctx context.Context) {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.Flush()
			return
		case <-t.C:
			p.Flush()
		}
	}
}
