package batch

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The Manager, its options, and the state of each batch that has not
// ended (active): counts per key and step, which applies an event to a
// batch's machine and persists it.

// Endpoints are the URLs a batch's lines may call (OpenAI's Batch
// endpoints that the edge serves).
var Endpoints = []string{"/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/completions"}

// CompletionWindow is the only window OpenAI offers, and the edge's.
const CompletionWindow = "24h"

const window = 24 * time.Hour

// PriorityHeader and PriorityBatch: every line carries
// "Iop-Priority: batch", the lowest class of the pool's fair share
// (SPEC X5): a line waits behind interactive requests of any key.
const (
	PriorityHeader = "Iop-Priority"
	PriorityBatch  = "batch"
)

// Options configure a Manager.
type Options struct {
	Store *Store
	// AsPrincipal returns a context under which the Handler serves a
	// request as the key named name, without its secret (the key store
	// holds only hashes), in the batch class: api.AsPrincipal with
	// api.WithPriority(pool.PriorityBatch).
	AsPrincipal func(ctx context.Context, name string) context.Context
	// Owner is the authenticated key of an API request (api.PrincipalFromContext);
	// ok false = open mode, owner "".
	Owner func(ctx context.Context) (name string, ok bool)
	// KeyActive reports why the key named name can no longer run requests
	// (revoked, expired, removed), nil while it can; nil = always.
	KeyActive func(name string) error
	// MaxInFlight bounds the lines of one batch in flight (batches.max_in_flight).
	MaxInFlight int
	// MaxPerKey bounds the batches of one key that have not ended
	// (batches.max_batches_per_key); 0 = no bound.
	MaxPerKey int
	// MaxLineBytes bounds one input line (http.max_body_bytes and room for
	// custom_id, method and url): a longer line is malformed, and is never
	// held in memory whole; 0 = no bound.
	MaxLineBytes int64
	Logger       *slog.Logger
	// Now is the clock of the batch's times and its window; nil = time.Now.
	Now func() time.Time
	// CheckEvery is how often a running batch looks at its key and its
	// window while no line ends; 0 = a second.
	CheckEvery time.Duration
}

// Manager runs the batches of one edge: Create, Cancel, the HTTP surface
// (http.go) and one driver goroutine per batch that has not ended (SPEC
// X2-X5). Start resumes the batches found in the store.
type Manager struct {
	o       Options
	handler http.Handler
	ctx     context.Context
	stop    context.CancelFunc
	wg      sync.WaitGroup
	closed  sync.Once

	createMu sync.Mutex // one Create at a time: the per-key bound is checked and taken at once
	mu       sync.Mutex
	live     map[string]*active
	lines    map[string]*lineCounts // per owner, since start
}

type lineCounts struct{ completed, failed, retried atomic.Int64 }

// active is a batch that has not ended.
type active struct {
	mu       sync.Mutex
	rec      Record // rec.Machine is the state; guarded by mu
	stopped  chan struct{}
	stopOnce sync.Once
	ended    chan struct{} // closed when its driver returns
	owner    string        // rec.Owner, which never changes
	j        atomic.Pointer[Journal]
	inFlight atomic.Int64
}

// New returns a Manager; Bind gives it the handler and Start starts it.
func New(o Options) *Manager {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxInFlight < 1 {
		o.MaxInFlight = 1
	}
	if o.CheckEvery <= 0 {
		o.CheckEvery = time.Second
	}
	if o.AsPrincipal == nil {
		o.AsPrincipal = func(ctx context.Context, _ string) context.Context { return ctx }
	}
	if o.Owner == nil {
		o.Owner = func(context.Context) (string, bool) { return "", false }
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Manager{o: o, ctx: ctx, stop: stop, live: map[string]*active{}, lines: map[string]*lineCounts{}}
}

// Bind sets the handler every line is served by: the edge's client HTTP
// handler, so a line goes through key scope, bounds, budgets, model
// groups, the queue and re-dispatch as a client's request does (SPEC X4).
func (m *Manager) Bind(h http.Handler) { m.handler = h }

// Close stops every driver and waits for them: lines in flight are
// cancelled and not journaled (they run again at the next start), the
// journals are fsynced. Then the store's lock is released.
// Idempotent.
func (m *Manager) Close() error {
	var err error
	m.closed.Do(func() {
		m.stop()
		m.wg.Wait()
		err = m.o.Store.Close()
	})
	return err
}

func (m *Manager) counts(owner string) *lineCounts {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.lines[owner]
	if c == nil {
		c = &lineCounts{}
		m.lines[owner] = c
	}
	return c
}

func (a *active) snapshot() Record {
	a.mu.Lock()
	r := a.rec
	a.mu.Unlock()
	if j := a.j.Load(); j != nil && !r.Status.Terminal() {
		n, u := j.Counts()
		r.Counts.Completed, r.Counts.Failed, r.Usage = n.Completed, n.Failed, u
	}
	return r
}

// step applies ev to a's machine; edit, when set, changes the record in
// the same persisted write (its errors, model, counts).
func (m *Manager) step(a *active, ev Event, edit func(*Record)) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	next, eff, err := a.rec.Machine.Step(ev)
	if err != nil {
		return err
	}
	if next == a.rec.Machine && eff == 0 {
		return nil
	}
	if next.Status != a.rec.Status {
		now := m.o.Now().Unix()
		switch next.Status {
		case InProgress:
			a.rec.InProgressAt = now
		case Finalizing:
			a.rec.FinalizingAt = now
		case Cancelling:
			a.rec.CancellingAt = now
		case Completed:
			a.rec.CompletedAt = now
		case Failed:
			a.rec.FailedAt = now
		case Cancelled:
			a.rec.CancelledAt = now
		case Expired:
			a.rec.ExpiredAt = now
		}
	}
	a.rec.Machine = next
	if edit != nil {
		edit(&a.rec)
	}
	if j := a.j.Load(); j != nil && !next.Status.Terminal() {
		n, u := j.Counts()
		a.rec.Counts.Completed, a.rec.Counts.Failed, a.rec.Usage = n.Completed, n.Failed, u
	}
	if eff&Persist != 0 {
		if err := m.o.Store.PutBatch(&a.rec); err != nil {
			// The state in memory goes on; the record on disk is the last
			// one written, and a restart resumes from it (idempotently).
			m.o.Logger.Error("batch record not written", "batch", a.rec.ID, "err", err)
		}
	}
	if eff&Stop != 0 {
		a.stopOnce.Do(func() { close(a.stopped) })
	}
	return nil
}

func (a *active) status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rec.Status
}
