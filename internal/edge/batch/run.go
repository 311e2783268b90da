package batch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

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

// maxAnswer bounds the answer of one line the driver holds (bytes); a
// larger one is the line's error response_too_large.
const maxAnswer = 32 << 20

// Retry-After bounds of a line refused for now (429, 503): the line waits
// and runs again, until the batch stops or its window ends.
const (
	minRetry = 250 * time.Millisecond
	maxRetry = 30 * time.Second
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

// Start resumes every batch of the store that has not ended (SPEC X3).
func (m *Manager) Start() {
	for _, r := range m.o.Store.Live() {
		m.launch(r)
	}
}

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

func (m *Manager) launch(r Record) {
	a := &active{rec: r, owner: r.Owner, stopped: make(chan struct{}), ended: make(chan struct{})}
	if r.Status == Cancelling || r.Status == Finalizing && r.Goal == Expired {
		a.stopOnce.Do(func() { close(a.stopped) })
	}
	m.mu.Lock()
	m.live[r.ID] = a
	m.mu.Unlock()
	m.wg.Add(1)
	go m.drive(a)
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

// CreateParams are POST /v1/batches' body (OpenAI's BatchNewParams).
type CreateParams struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata"`
}

// ParamError is a bad parameter of a request (400 naming it).
type ParamError struct{ Param, Msg string }

func (e *ParamError) Error() string { return e.Param + ": " + e.Msg }

// ErrTooManyBatches is Create's error for a key with Options.MaxPerKey
// batches that have not ended (HTTP 429).
var ErrTooManyBatches = errors.New("too many batches that have not ended")

// Create makes a batch of owner over its file p.InputFileID (SPEC X2): it
// is validating, and runs at once. A key with Options.MaxPerKey batches
// that have not ended gets ErrTooManyBatches (SPEC X4).
func (m *Manager) Create(owner string, p CreateParams) (*Record, error) {
	if !slices.Contains(Endpoints, p.Endpoint) {
		return nil, &ParamError{"endpoint", fmt.Sprintf("want one of %s, got %q", strings.Join(Endpoints, ", "), trunc(p.Endpoint))}
	}
	if p.CompletionWindow != CompletionWindow {
		return nil, &ParamError{"completion_window", fmt.Sprintf("want %q, got %q", CompletionWindow, trunc(p.CompletionWindow))}
	}
	if len(p.Metadata) > 16 {
		return nil, &ParamError{"metadata", "at most 16 pairs"}
	}
	for k, v := range p.Metadata {
		if len(k) > 64 || len(v) > 512 {
			return nil, &ParamError{"metadata", "keys are at most 64 characters, values at most 512"}
		}
	}
	f, err := m.o.Store.File(owner, p.InputFileID)
	if err != nil {
		return nil, &ParamError{"input_file_id", "no such file: " + trunc(p.InputFileID)}
	}
	if f.Purpose != "batch" {
		return nil, &ParamError{"input_file_id", fmt.Sprintf("the file's purpose is %q; a batch's input must be uploaded with purpose \"batch\"", f.Purpose)}
	}
	m.createMu.Lock()
	defer m.createMu.Unlock()
	if m.o.MaxPerKey > 0 {
		if n := m.liveOf(owner); n >= m.o.MaxPerKey {
			return nil, fmt.Errorf("%w: this key has %d (batches.max_batches_per_key %d); wait for one to end or cancel one", ErrTooManyBatches, n, m.o.MaxPerKey)
		}
	}
	now := m.o.Now()
	r := Record{Machine: Machine{Status: Validating}, ID: NewBatchID(), Owner: owner, Endpoint: p.Endpoint,
		InputFileID: f.ID, CompletionWindow: p.CompletionWindow, Metadata: p.Metadata,
		CreatedAt: now.Unix(), ExpiresAt: now.Add(window).Unix(), Counts: Counts{Total: int64(f.Lines)}}
	if err := m.o.Store.PutBatch(&r); err != nil {
		return nil, err
	}
	m.launch(r)
	return &r, nil
}

// liveOf counts owner's batches that have not ended.
func (m *Manager) liveOf(owner string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, a := range m.live {
		if a.owner == owner {
			n++
		}
	}
	return n
}

// ended returns a channel closed when batch id's driver returned (nil
// when it runs none).
func (m *Manager) ended(id string) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a := m.live[id]; a != nil {
		return a.ended
	}
	return nil
}

// Get returns owner's batch id with its counts so far.
func (m *Manager) Get(owner, id string) (*Record, error) {
	m.mu.Lock()
	a := m.live[id]
	m.mu.Unlock()
	if a != nil {
		r := a.snapshot()
		if r.Owner != owner {
			return nil, ErrNotFound
		}
		return &r, nil
	}
	return m.o.Store.Batch(owner, id)
}

// List returns owner's batches, newest first.
func (m *Manager) List(owner, after string, limit int) ([]Record, bool) {
	list, more := m.o.Store.Batches(owner, after, limit)
	for i := range list {
		m.mu.Lock()
		a := m.live[list[i].ID]
		m.mu.Unlock()
		if a != nil {
			list[i] = a.snapshot()
		}
	}
	return list, more
}

// Cancel cancels owner's batch id (SPEC X2): it is cancelling, its lines
// in flight are stopped, and it is cancelled once its files are written.
func (m *Manager) Cancel(owner, id string) (*Record, error) {
	m.mu.Lock()
	a := m.live[id]
	m.mu.Unlock()
	if a == nil {
		r, err := m.o.Store.Batch(owner, id)
		if err != nil {
			return nil, err
		}
		if _, _, err := r.Machine.Step(EvCancel); err != nil {
			return nil, err
		}
		return r, nil
	}
	if a.snapshot().Owner != owner {
		return nil, ErrNotFound
	}
	if err := m.step(a, EvCancel, nil); err != nil {
		return nil, err
	}
	r := a.snapshot()
	return &r, nil
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

// line is one input line as validation read it.
type line struct {
	no       int // 1-based
	off, n   int64
	customID string
	err      string // why it is malformed; "" = runnable
	model    string
}

// drive runs batch a to its end, or until Close (SPEC X2, X3).
func (m *Manager) drive(a *active) {
	defer m.wg.Done()
	defer func() {
		m.mu.Lock()
		delete(m.live, a.rec.ID)
		m.mu.Unlock()
		close(a.ended)
	}()
	rec := a.snapshot()
	j, _, err := m.o.Store.OpenJournal(rec.ID)
	if err != nil {
		m.o.Logger.Error("batch journal unreadable; the batch waits for a restart", "batch", rec.ID, "err", err)
		return
	}
	a.j.Store(j)
	defer j.Close()
	in, _, err := m.o.Store.Content(rec.Owner, rec.InputFileID)
	var lines []line
	if err == nil {
		lines, err = scan(in, rec.Endpoint, m.o.MaxLineBytes)
		defer in.Close()
	}
	if a.status() == Validating {
		if err != nil {
			_ = m.step(a, EvInvalid, func(r *Record) {
				r.Errors = append(r.Errors, BatchError{Code: "invalid_file", Message: "the input file cannot be read: " + err.Error()})
			})
			return
		}
		model := ""
		for _, l := range lines {
			if l.err != "" && !j.Done(l.no) {
				if j.Append(Entry{Line: l.no, Record: errorRecord(rec.ID, l, "invalid_request", fmt.Sprintf("line %d: %s", l.no, l.err))}) == nil {
					m.counts(rec.Owner).failed.Add(1)
				}
			}
			if model == "" && l.err == "" {
				model = l.model
			}
		}
		_ = m.step(a, EvValidated, func(r *Record) { r.Model, r.Counts.Total = model, int64(len(lines)) })
	}
	if a.status() == InProgress {
		if err != nil {
			m.o.Logger.Error("batch input unreadable; the batch waits for a restart", "batch", rec.ID, "err", err)
			return
		}
		m.runLines(a, in, lines)
	}
	if m.ctx.Err() != nil {
		return
	}
	if s := a.status(); s == Cancelling || s == Finalizing {
		if err := m.write(a, lines); err != nil {
			m.o.Logger.Error("batch files not written; the batch waits for a restart", "batch", rec.ID, "err", err)
			return
		}
		_ = m.step(a, EvWritten, nil)
		j.Close()
		m.o.Store.RemoveJournal(rec.ID)
	}
}

// runLines runs a's lines not yet answered, at most MaxInFlight at once,
// until each is answered, the batch stops (cancel, revoked key, window
// ended) or the Manager closes.
func (m *Manager) runLines(a *active, in *os.File, lines []line) {
	ctx, cancel := context.WithCancel(m.ctx)
	defer cancel()
	rec := a.snapshot()
	j := a.j.Load()
	expiry := time.NewTimer(time.Unix(rec.ExpiresAt, 0).Sub(m.o.Now()))
	defer expiry.Stop()
	tick := time.NewTicker(m.o.CheckEvery)
	defer tick.Stop()
	sem := make(chan struct{}, m.o.MaxInFlight)
	var wg sync.WaitGroup
	// watch handles what may stop the batch; it reports whether it did.
	watch := func() bool {
		select {
		case <-a.stopped:
			return true
		case <-ctx.Done():
			return true
		default:
		}
		if m.o.KeyActive != nil {
			if err := m.o.KeyActive(rec.Owner); err != nil {
				_ = m.step(a, EvRevoked, func(r *Record) {
					r.Errors = append(r.Errors, BatchError{Code: "api_key_revoked", Message: "the batch's key can no longer make requests: " + err.Error()})
				})
				return true
			}
		}
		return false
	}
	stopped := false
dispatch:
	for i := range lines {
		l := lines[i]
		if l.err != "" || j.Done(l.no) {
			continue
		}
		if watch() {
			stopped = true
			break
		}
		for acquired := false; !acquired; {
			select {
			case sem <- struct{}{}:
				acquired = true
			case <-a.stopped:
				stopped = true
				break dispatch
			case <-ctx.Done():
				stopped = true
				break dispatch
			case <-expiry.C:
				_ = m.step(a, EvExpired, nil)
			case <-tick.C:
				if watch() {
					stopped = true
					break dispatch
				}
			}
		}
		wg.Add(1)
		a.inFlight.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem; a.inFlight.Add(-1) }()
			if e, ok := m.runLine(ctx, a, in, l); ok {
				if err := j.Append(e); err == nil {
					c := m.counts(rec.Owner)
					if e.OK {
						c.completed.Add(1)
					} else {
						c.failed.Add(1)
					}
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-a.stopped:
			stopped = true
			cancel()
		case <-ctx.Done():
			stopped = true
		case <-expiry.C:
			_ = m.step(a, EvExpired, nil)
		case <-tick.C:
			if watch() {
				stopped = true
				cancel()
			}
		}
	}
	if m.ctx.Err() != nil {
		return
	}
	if stopped {
		_ = m.step(a, EvDrained, nil)
		return
	}
	_ = m.step(a, EvAnswered, nil)
}

// lineRequest is one input line (OpenAI's batch input line).
type lineRequest struct {
	CustomID *string         `json:"custom_id"`
	Method   *string         `json:"method"`
	URL      *string         `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// scan reads the input file's lines and checks each (SPEC X2): a JSON
// object with a custom_id (a string, unique in the file), method POST, url
// the batch's endpoint and a body object naming a model, not streamed.
// A blank last line is no line. A line over maxLine bytes (0 = no bound)
// is malformed, and is counted, never held whole.
func scan(f *os.File, endpoint string, maxLine int64) ([]line, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	br := lineReader(f)
	var lines []line
	seen := map[string]int{}
	var off int64
	for no := 1; ; no++ {
		b, n, over, err := readLine(br, maxLine)
		if n == 0 && err == io.EOF {
			break
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
		l := line{no: no, off: off, n: n}
		off += n
		if over {
			l.err = fmt.Sprintf("%d bytes, over the bound of a line (%d: the edge's http.max_body_bytes and 64 KiB)", n, maxLine)
		} else {
			l.customID, l.model, l.err = check(bytes.TrimSpace(b), endpoint)
		}
		if l.err == "" {
			if first, dup := seen[l.customID]; dup {
				l.err = fmt.Sprintf("custom_id %q is the custom_id of line %d: each line needs its own", trunc(l.customID), first)
			} else {
				seen[l.customID] = no
			}
		}
		lines = append(lines, l)
		if err == io.EOF {
			break
		}
	}
	if len(lines) == 0 {
		return nil, ErrEmptyInput
	}
	return lines, nil
}

// readLine reads one line of br with its newline: its bytes (nil when
// over), its length n, and over when n passed max (0 = no bound); memory
// stays max and br's buffer whatever the line's length.
func readLine(br *bufio.Reader, max int64) (b []byte, n int64, over bool, err error) {
	for {
		frag, err := br.ReadSlice('\n')
		n += int64(len(frag))
		if !over {
			if max > 0 && n > max {
				over, b = true, nil
			} else {
				b = append(b, frag...)
			}
		}
		if err != bufio.ErrBufferFull {
			return b, n, over, err
		}
	}
}

func check(b []byte, endpoint string) (customID, model, problem string) {
	if len(b) == 0 {
		return "", "", "an empty line; each line is one JSON request"
	}
	var r lineRequest
	if err := json.Unmarshal(b, &r); err != nil {
		return "", "", "not a JSON object: " + err.Error()
	}
	if r.CustomID != nil {
		customID = *r.CustomID
	}
	switch {
	case r.CustomID == nil || *r.CustomID == "":
		return customID, "", "custom_id: want a non-empty string"
	case len(*r.CustomID) > 512:
		return customID, "", "custom_id: at most 512 bytes"
	case r.Method == nil || *r.Method != http.MethodPost:
		return customID, "", `method: want "POST"`
	case r.URL == nil || *r.URL != endpoint:
		got := ""
		if r.URL != nil {
			got = *r.URL
		}
		return customID, "", fmt.Sprintf("url: want the batch's endpoint %q, got %q", endpoint, trunc(got))
	}
	var body struct {
		Model  *string `json:"model"`
		Stream *bool   `json:"stream"`
	}
	if len(r.Body) == 0 || r.Body[0] != '{' || json.Unmarshal(r.Body, &body) != nil {
		return customID, "", "body: want a JSON object, the request's body"
	}
	if body.Model == nil || *body.Model == "" {
		return customID, "", "body.model: want the model group's name"
	}
	if body.Stream != nil && *body.Stream {
		return customID, *body.Model, "body.stream: a batch's answers are not streamed; drop stream or set it false"
	}
	return customID, *body.Model, ""
}

// runLine serves line l as a's key through the handler, and returns its
// journal entry; ok is false when the line did not end (the batch stopped
// or the Manager closed): it is not answered and runs again if the batch
// resumes. A 429 or 503 (a bound of the key, the queue, no provider now)
// waits its Retry-After and runs again (SPEC X5).
func (m *Manager) runLine(ctx context.Context, a *active, in *os.File, l line) (Entry, bool) {
	rec := a.snapshot()
	raw := make([]byte, l.n)
	if _, err := in.ReadAt(raw, l.off); err != nil {
		return Entry{Line: l.no, Record: errorRecord(rec.ID, l, "internal_error", "the line could not be read again: "+err.Error())}, true
	}
	var req lineRequest
	_ = json.Unmarshal(raw, &req) // scan checked it
	for {
		w, aborted := m.serve(ctx, rec, req.Body)
		if ctx.Err() != nil {
			return Entry{}, false
		}
		if aborted {
			return Entry{Line: l.no, Record: errorRecord(rec.ID, l, "internal_error", "the request was aborted")}, true
		}
		if w.status == http.StatusTooManyRequests || w.status == http.StatusServiceUnavailable {
			m.counts(rec.Owner).retried.Add(1)
			t := time.NewTimer(retryAfter(w.header.Get("Retry-After")))
			select {
			case <-ctx.Done():
				t.Stop()
				return Entry{}, false
			case <-t.C:
			}
			continue
		}
		return answer(rec.ID, l, w), true
	}
}

// serve runs one request of the batch's key through the handler.
func (m *Manager) serve(ctx context.Context, rec Record, body []byte) (w *recorder, aborted bool) {
	r, _ := http.NewRequestWithContext(m.o.AsPrincipal(ctx, rec.Owner), http.MethodPost, rec.Endpoint, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(PriorityHeader, PriorityBatch)
	r.RemoteAddr = "batch"
	w = &recorder{header: http.Header{}}
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				panic(p)
			}
			aborted = true
		}
	}()
	m.handler.ServeHTTP(w, r)
	return w, false
}

func retryAfter(v string) time.Duration {
	d := time.Second
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		d = time.Duration(s) * time.Second
	}
	return min(max(d, minRetry), maxRetry)
}

// recorder is the ResponseWriter of a line: status, headers and up to
// maxAnswer bytes of the body.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
	over   bool
}

func (w *recorder) Header() http.Header { return w.header }
func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *recorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.body.Len()+len(p) > maxAnswer {
		w.over = true
		return 0, errors.New("batch line answer over its bound")
	}
	return w.body.Write(p)
}
func (w *recorder) Flush() {}

// Output line shapes (OpenAI API reference, "The request output object").
type outResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

type outError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Line    int    `json:"line,omitempty"`
}

type outLine struct {
	ID       string       `json:"id"`
	CustomID *string      `json:"custom_id"`
	Response *outResponse `json:"response"`
	Error    *outError    `json:"error"`
}

func requestID(batchID string, no int) string {
	return "batch_req_" + strings.TrimPrefix(batchID, "batch_") + "_" + strconv.Itoa(no)
}

func errorRecord(batchID string, l line, code, msg string) json.RawMessage {
	o := outLine{ID: requestID(batchID, l.no), Error: &outError{Code: code, Message: msg, Line: l.no}}
	if l.customID != "" {
		o.CustomID = &l.customID
	}
	b, _ := json.Marshal(o)
	return b
}

// answer is a served line's entry: the output file's for a 2xx, the error
// file's otherwise, with the answer's status, request id and body.
func answer(batchID string, l line, w *recorder) Entry {
	if w.over {
		return Entry{Line: l.no, Record: errorRecord(batchID, l, "response_too_large", fmt.Sprintf("the answer is over %d bytes", maxAnswer))}
	}
	if w.status == 0 {
		w.status = http.StatusOK
	}
	body := w.body.Bytes()
	if !json.Valid(body) {
		body, _ = json.Marshal(string(body))
	}
	cid := l.customID
	o := outLine{ID: requestID(batchID, l.no), CustomID: &cid,
		Response: &outResponse{StatusCode: w.status, RequestID: w.header.Get("X-Request-Id"), Body: body}}
	b, _ := json.Marshal(o)
	e := Entry{Line: l.no, OK: w.status/100 == 2, Record: b}
	var u struct {
		Usage struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
			Input      int64 `json:"input_tokens"`
			Output     int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	if e.OK && json.Unmarshal(body, &u) == nil {
		e.In = max(u.Usage.Prompt, u.Usage.Input)
		e.Out = max(u.Usage.Completion, u.Usage.Output)
	}
	return e
}

// write writes a's output and error files from its journal (SPEC X2):
// the lines in input order; a batch whose window ended adds each line
// that never ran as batch_expired. Idempotent: the files' ids follow from
// the batch's, so writing again after a crash replaces them.
func (m *Manager) write(a *active, lines []line) error {
	rec := a.snapshot()
	j := a.j.Load()
	if err := j.Sync(); err != nil {
		return err
	}
	reread, entries, err := m.o.Store.OpenJournal(rec.ID) // a second reader of the same file
	if err != nil {
		return err
	}
	reread.Close()
	if rec.Goal == Expired {
		for _, l := range lines {
			if l.err == "" && !j.Done(l.no) {
				entries = append(entries, Entry{Line: l.no, Record: errorRecord(rec.ID, l, "batch_expired",
					"This request could not be executed before the completion window expired.")})
			}
		}
	}
	slices.SortFunc(entries, func(a, b Entry) int { return a.Line - b.Line })
	var out, errs bytes.Buffer
	var n Counts
	var use Usage
	for _, e := range entries {
		dst := &errs
		if e.OK {
			dst = &out
			n.Completed++
		} else {
			n.Failed++
		}
		use.Input += e.In
		use.Output += e.Out
		dst.Write(e.Record)
		dst.WriteByte('\n')
	}
	suffix := strings.TrimPrefix(rec.ID, "batch_")
	var outID, errID string
	if out.Len() > 0 {
		outID = "file-" + strings.ToUpper(suffix) + "-output"
		if _, err := m.o.Store.PutOutput(outID, rec.Owner, rec.ID+"_output.jsonl", out.Bytes(), int(n.Completed)); err != nil {
			return err
		}
	}
	if errs.Len() > 0 {
		errID = "file-" + strings.ToUpper(suffix) + "-errors"
		if _, err := m.o.Store.PutOutput(errID, rec.Owner, rec.ID+"_errors.jsonl", errs.Bytes(), int(n.Failed)); err != nil {
			return err
		}
	}
	a.mu.Lock()
	a.rec.OutputFileID, a.rec.ErrorFileID = outID, errID
	a.rec.Counts.Completed, a.rec.Counts.Failed, a.rec.Usage = n.Completed, n.Failed, use
	a.mu.Unlock()
	return nil
}

func trunc(s string) string {
	if len(s) > 128 {
		return s[:128] + "…"
	}
	return s
}
