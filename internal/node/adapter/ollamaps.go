package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"iop/internal/node/adapter/upstream"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// Residency of an Ollama adapter's models (SPEC U6, U7), for an adapter
// that discovers its models (discovery_interval_ms > 0, SPEC D1: the
// operator lets the node ask the backend about its models beyond the
// requests it sends; without it the node sends Ollama nothing but those
// requests). Ollama loads and
// unloads models itself (its keep_alive, its own memory scheduler), so
// the node reads what is loaded from GET /api/ps (Ollama 0.17.4: models[]
// of name, size, size_vram, expires_at) and what exists from GET
// /api/tags, and adds what only it sees: the requests it has in flight
// (a model asked for and not yet in /api/ps is "loading") and the load
// time Ollama reports in a chat's final line (load_duration, ns) when the
// model was not loaded as the request began.
//
// It asks Ollama when something it did may have changed the answer — a
// request for a model that was not loaded began, a request ended — at
// most once per psMinGap; when the earliest expires_at passes; and, for
// what it cannot see (another client of the same Ollama, `ollama stop`,
// a model evicted by Ollama for room), every psInterval. The models list
// is read again every tagsEvery polls.
const (
	psInterval = 5 * time.Second
	psMinGap   = 250 * time.Millisecond
	psTimeout  = 2 * time.Second
	tagsEvery  = 6
	// psExpirySlack is how long after an expires_at the next poll goes
	// (Ollama unloads at the instant; give it the time to do so).
	psExpirySlack = 100 * time.Millisecond
	// maxPSModels bounds what one answer makes the node hold.
	maxPSModels = 4096
	// maxPSBody bounds an /api/ps or /api/tags answer read, bytes.
	maxPSBody = 4 << 20
)

// PSPath is Ollama's list of loaded models (Ollama docs/api.md, "List
// Running Models").
const PSPath = "/api/ps"

// psCounts are one model's counters (SPEC U8): loads its requests saw,
// their summed load_duration, and its disappearances from /api/ps — at or
// after its expires_at (idle) or before (evicted: Ollama made room, or
// someone stopped it).
type psCounts struct {
	loads, idle, evicted uint64
	loadMsTotal          int64
	loadSeen             bool // this residency's load is counted
}

// count is n's counters; w.mu held.
func (w *psWatch) count(n string) *psCounts {
	c := w.counts[n]
	if c == nil {
		if len(w.counts) >= maxPSModels {
			return &psCounts{}
		}
		c = &psCounts{}
		w.counts[n] = c
	}
	return c
}

// OllamaWatchers is a node's Ollama residency watchers (SPEC U7): one per
// Ollama server (base URL and credential), shared by the Sets of every
// edge, so each server is read once however many edges the node serves
// and every edge sees the loads the others' requests began. Safe for
// concurrent use.
type OllamaWatchers struct {
	mu sync.Mutex
	m  map[string]*psWatch
}

// NewOllamaWatchers returns an empty set of watchers.
func NewOllamaWatchers() *OllamaWatchers { return &OllamaWatchers{m: map[string]*psWatch{}} }

// acquire is the watcher of ep's server, made on the first call for it
// (with ep and sig); each acquire is matched by one release.
func (o *OllamaWatchers) acquire(ep *upstream.Endpoint, sig *Signal) *psWatch {
	key := ep.Base.String() + "\x00" + ep.AuthHeader + "\x00" + ep.AuthValue
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.m[key]
	if w == nil {
		w = newPSWatch(ep, sig)
		w.key = key
		o.m[key] = w
	}
	w.refs++
	return w
}

// release drops one reference to w; the last stops it.
func (o *OllamaWatchers) release(w *psWatch) {
	o.mu.Lock()
	w.refs--
	last := w.refs == 0
	if last {
		delete(o.m, w.key)
	}
	o.mu.Unlock()
	if last {
		w.stop()
	}
}

// psModel is one model of /api/ps.
type psModel struct {
	Name      string    `json:"name"`
	Model     string    `json:"model"`
	Size      int64     `json:"size"`
	SizeVRAM  int64     `json:"size_vram"`
	ExpiresAt time.Time `json:"expires_at"`
}

// psWatch is one Ollama adapter instance's view of its server's residency.
// Its goroutine starts at the first Report (the session's residency loop)
// and ends at stop (the last Set using it closed).
type psWatch struct {
	key    string // guarded by OllamaWatchers.mu, as refs
	refs   int
	ep     *upstream.Endpoint
	signal *Signal
	now    func() time.Time

	start    sync.Once
	kick     chan struct{}   // cap 1
	ctx      context.Context // ended by stop
	cancel   context.CancelFunc
	finished chan struct{}

	mu       sync.Mutex
	stopped  bool
	loaded   map[string]psModel // NormalizeTag(name) → its /api/ps entry
	known    map[string]bool    // NormalizeTag(name) of /api/tags' models
	asked    map[string]string  // NormalizeTag(target) → the target as requests name it (bounded)
	inflight map[string]int     // NormalizeTag(target) → requests in flight
	loadMs   map[string]int64   // NormalizeTag(name) → the last measured load
	counts   map[string]*psCounts
	lastPoll time.Time
	polls    int
	// dirty: a warm model's in_flight moved since the last Notify; the
	// next poll notifies (so a busy model wakes the reports at most once
	// per psMinGap, not per request).
	dirty bool
}

func newPSWatch(ep *upstream.Endpoint, sig *Signal) *psWatch {
	ctx, cancel := context.WithCancel(context.Background())
	return &psWatch{ep: ep, signal: sig, now: time.Now, kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel,
		finished: make(chan struct{}), loaded: map[string]psModel{}, known: map[string]bool{}, asked: map[string]string{},
		inflight: map[string]int{}, loadMs: map[string]int64{}, counts: map[string]*psCounts{}}
}

// Begin records a request for target that is about to be sent and returns
// the end to call with the load_duration Ollama reported (0 = none) once
// it ended. A target not loaded by the last look is "loading" from now
// until a look finds it (reported at once); a change of in_flight is
// reported with the next poll.
func (w *psWatch) Begin(target string) func(loadNs int64) {
	n := upstream.NormalizeTag(target)
	w.mu.Lock()
	_, warm := w.loaded[n]
	if _, ok := w.asked[n]; !ok && len(w.asked) < maxPSModels {
		w.asked[n] = target
	}
	w.inflight[n]++
	w.dirty = w.dirty || warm
	w.mu.Unlock()
	if !warm { // it turns "loading": say so now
		w.signal.Notify()
	}
	w.poke()
	var once sync.Once
	return func(loadNs int64) {
		once.Do(func() {
			w.mu.Lock()
			if w.inflight[n]--; w.inflight[n] <= 0 {
				delete(w.inflight, n)
			}
			w.dirty = true
			if !warm && loadNs > 0 {
				ms := max(loadNs/int64(time.Millisecond), 1)
				w.loadMs[n] = ms
				if c := w.count(n); !c.loadSeen { // concurrent requests share one load
					c.loads, c.loadMsTotal, c.loadSeen = c.loads+1, c.loadMsTotal+ms, true
				}
			}
			w.mu.Unlock()
			w.poke() // the poll that follows notifies
		})
	}
}

func (w *psWatch) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Report is the instance's models' residency, sorted by model; it starts
// the watching goroutine on its first call. Each model is reported under
// its tagged name ("tiny:latest"), its bare name when the tag is
// ":latest", and the name requests used.
func (w *psWatch) Report() []*iop.ModelResidency {
	w.start.Do(func() {
		w.mu.Lock()
		stopped := w.stopped
		w.mu.Unlock()
		if stopped {
			close(w.finished)
			return
		}
		go w.loop()
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	names := map[string]bool{}
	for n := range w.known {
		names[n] = true
	}
	for n := range w.loaded {
		names[n] = true
	}
	for n := range w.asked {
		names[n] = true
	}
	out := make([]*iop.ModelResidency, 0, len(names))
	add := func(name, n string) {
		if len(out) >= maxPSModels {
			return
		}
		r := &iop.ModelResidency{Model: name, State: protocol.ResidencyUnloaded, LoadMs: w.loadMs[n],
			InFlight: int32(min(w.inflight[n], 1<<30))}
		if c := w.counts[n]; c != nil {
			r.Loads, r.LoadMsTotal, r.IdleUnloads, r.Evictions = c.loads, c.loadMsTotal, c.idle, c.evicted
		}
		if m, ok := w.loaded[n]; ok {
			r.State, r.MemoryMb = protocol.ResidencyLoaded, (m.Size+(1<<20)-1)>>20
		} else if w.inflight[n] > 0 {
			r.State = protocol.ResidencyLoading
		}
		out = append(out, r)
	}
	for n := range names {
		add(n, n)
		if bare, ok := strings.CutSuffix(n, ":latest"); ok && bare != "" {
			add(bare, n)
		}
		if t := w.asked[n]; t != "" && t != n && t+":latest" != n {
			add(t, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

// stop ends the goroutine, if one started, and waits for it.
func (w *psWatch) stop() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.stopped = true
	w.mu.Unlock()
	w.cancel()
	w.start.Do(func() { close(w.finished) })
	<-w.finished
}

// loop polls /api/ps: at once, on a kick (at most every psMinGap), at the
// earliest expires_at, and every psInterval.
func (w *psWatch) loop() {
	defer close(w.finished)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-t.C:
		case <-w.kick:
			if gap := psMinGap - w.now().Sub(w.lastPollTime()); gap > 0 {
				if !t.Stop() {
					select {
					case <-t.C:
					default:
					}
				}
				t.Reset(gap)
				continue
			}
		}
		next := w.poll()
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
	}
}

func (w *psWatch) lastPollTime() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastPoll
}

// poll reads /api/ps (and every tagsEvery-th time /api/tags), updates the
// view, notifies the signal when it changed, and returns how long until
// the next poll. A failed read keeps the last view (a server that cannot
// be reached is health's business, SPEC H2).
func (w *psWatch) poll() time.Duration {
	ctx, cancel := context.WithTimeout(w.ctx, psTimeout)
	defer cancel()
	ps, psErr := w.readPS(ctx)
	w.mu.Lock()
	w.polls++
	readTags := w.polls%tagsEvery == 1
	w.mu.Unlock()
	var tags []string
	var tagsErr error = errors.New("not read")
	if readTags {
		tags, tagsErr = upstream.ListModels(ctx, w.ep, "/api/tags")
	}
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lastPoll = now
	changed := false
	if psErr == nil {
		loaded := make(map[string]psModel, len(ps))
		for _, m := range ps {
			name := m.Name
			if name == "" {
				name = m.Model
			}
			if name == "" || len(name) > upstream.MaxModelName || len(loaded) >= maxPSModels {
				continue
			}
			loaded[upstream.NormalizeTag(name)] = m
		}
		changed = !sameLoaded(w.loaded, loaded)
		for n, m := range w.loaded {
			if _, still := loaded[n]; !still {
				c := w.count(n)
				c.loadSeen = false
				if !m.ExpiresAt.IsZero() && !now.Before(m.ExpiresAt.Add(-psExpirySlack)) {
					c.idle++
				} else {
					c.evicted++
				}
			}
		}
		w.loaded = loaded
	}
	if tagsErr == nil {
		known := make(map[string]bool, len(tags))
		for _, n := range tags {
			if len(known) < maxPSModels {
				known[upstream.NormalizeTag(n)] = true
			}
		}
		if len(known) != len(w.known) {
			changed = true
		}
		for n := range known {
			changed = changed || !w.known[n]
		}
		w.known = known
	}
	if changed || w.dirty {
		w.dirty = false
		w.signal.Notify()
	}
	next := psInterval
	for _, m := range w.loaded {
		if d := m.ExpiresAt.Sub(now) + psExpirySlack; !m.ExpiresAt.IsZero() && d > 0 && d < next {
			next = d
		}
	}
	return next
}

func sameLoaded(a, b map[string]psModel) bool {
	if len(a) != len(b) {
		return false
	}
	for n, m := range a {
		o, ok := b[n]
		if !ok || o.Size != m.Size {
			return false
		}
	}
	return true
}

// readPS GETs /api/ps. Errors: the transport's, *upstream.StatusError, or
// an answer that is not its JSON.
func (w *psWatch) readPS(ctx context.Context) ([]psModel, error) {
	req, err := w.ep.NewRequest(ctx, http.MethodGet, PSPath, nil)
	if err != nil {
		return nil, err
	}
	resp, err := w.ep.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, &upstream.StatusError{Status: resp.StatusCode}
	}
	var body struct {
		Models []psModel `json:"models"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxPSBody)).Decode(&body); err != nil {
		return nil, fmt.Errorf("%s: %w", PSPath, err)
	}
	return body.Models, nil
}

// KeepAlive is an ollama adapter's keep_alive (AdapterConfig.keep_alive,
// SPEC U7) as the JSON value /api/chat and /api/embed take: whole seconds
// as a JSON number, a duration as a JSON string (protocol.KeepAliveSeconds);
// "" = nil (Ollama's own default, OLLAMA_KEEP_ALIVE). Errors: ErrBadKeepAlive.
func KeepAlive(s string) (json.RawMessage, error) {
	if s == "" {
		return nil, nil
	}
	secs, err := protocol.KeepAliveSeconds(s)
	if err != nil {
		return nil, err
	}
	if secs {
		n, _ := strconv.ParseInt(s, 10, 64)
		return json.RawMessage(strconv.FormatInt(n, 10)), nil
	}
	return json.Marshal(s)
}

// ErrBadKeepAlive (NewSet): an adapter's keep_alive is not a duration or
// whole seconds, or the adapter is not an ollama one.
var ErrBadKeepAlive = protocol.ErrBadKeepAlive
