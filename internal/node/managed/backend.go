// Package managed runs a node's managed backends (SPEC U1-U5): programs such
// as llama-server that serve one model per process and that the node starts
// on the first request for a model, stops when idle or to make room, and
// restarts after a crash with a backoff. A Backend owns one managed[] entry
// of the node's config: its processes, their ports and logs, and a Machine
// (machine.go) that decides what runs.
//
// What a Backend runs comes only from the node's own config file (the
// command, the model files): callers name a model, and a name that is not
// one of the backend's models starts nothing (SPEC U1).
//
// Processes: started without a shell (os/exec with an argument vector),
// each in a process group of its own (Setpgid) so that a stop signals what
// it forked too, with SysProcAttr.Pdeathsig = SIGKILL so that it dies with
// the node even after kill -9 (Linux delivers it when the thread that
// forked the child exits: every child is forked by one goroutine locked to
// its OS thread for the Backend's life, which ends only after every child
// is gone). stdout and stderr go to a ring of the last 64 KiB per model. A
// stop is SIGTERM to the group, then SIGKILL after the stop grace. Each
// listens on 127.0.0.1 on a port of port_range.
//
// Goroutines: one timer loop and one starter per Backend, one per process
// (start, health polling, exit watch) and one per stop; all have ended
// when Close returns.
//
// Files: backend.go, the Backend, its machine's effects and its processes;
// lifecycle.go, New, Acquire and Close; models.go, the models scanned and
// what is reported of them; machine.go, the pure machine; ring.go, a
// process's log.
package managed

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults of a Backend (docs/config.md, managed[]).
const (
	// MemoryFactor: a model's memory is its file's size × 1.2, in MiB
	// rounded up (weights plus a context's KV cache and compute buffers of
	// a small context; set memory_budget_mb with that in mind).
	MemoryFactor = 1.2
	// DefaultHealthPoll is how often a starting process's health path is
	// polled.
	DefaultHealthPoll = 50 * time.Millisecond
	// DefaultStopGrace is how long a stop waits after SIGTERM before
	// SIGKILL.
	DefaultStopGrace = 10 * time.Second
	// Backoffs after a failed load or a crash (doubling per consecutive
	// failure).
	DefaultBackoffMin = time.Second
	DefaultBackoffMax = time.Minute
	// NotifyGap spaces the OnChange calls of steps that only moved
	// in_flight (the session's report spaces such reports the same).
	NotifyGap = 250 * time.Millisecond
)

// ErrUnavailable is the error of an Acquire that cannot get its model
// loaded: unknown model, no memory, a failed load, the backend closing
// (failure code model_unavailable); the text says which.
var ErrUnavailable = errors.New("model unavailable")

// Config is one managed backend (internal/node/config.Managed, resolved).
type Config struct {
	Name      string
	Command   []string // command[0] an absolute path; "{model}", "{name}", "{port}" substituted
	ModelsDir string
	Models    map[string]string // name → file
	// Env is added to the environment each process inherits (childEnv).
	Env          map[string]string
	HealthPath   string
	ReadyTimeout time.Duration
	IdleUnload   time.Duration
	MaxLoaded    int
	BudgetMB     int64
	Preload      []string
	PortFirst    int
	PortLast     int
	Logger       *slog.Logger // nil: discard
	// OnChange, when set, is called after a step of the machine that may
	// have changed a residency, with the Backend's lock held: it must not
	// block or call the Backend (the node's residency Signal). A step that
	// only moved a model's requests in flight (a request granted on a
	// loaded model, one ended) calls it at most every NotifyGap, the last
	// of a burst NotifyGap after the one before (SPEC U6).
	OnChange func()
	// Zero = the defaults above (tests shorten them).
	HealthPoll             time.Duration
	StopGrace              time.Duration
	BackoffMin, BackoffMax time.Duration
	LogBytes               int
}

// proc is one model's process.
type proc struct {
	model    string
	port     int
	cmd      *exec.Cmd
	log      *ring
	started  chan struct{} // closed after Start returned (pid set when it succeeded)
	pid      int
	exited   chan struct{} // closed after Wait returned
	exitErr  error         // set before exited closes
	stopping bool          // guarded by Backend.mu: the exit is a stop's
}

// grant is what an Acquire waits for.
type grant struct {
	port int
	err  error
}

// Backend runs one managed backend's processes. Its methods are safe for
// concurrent use.
type Backend struct {
	cfg   Config
	log   *slog.Logger
	hc    *http.Client
	start chan startReq // to the locked starter goroutine
	kick  chan struct{} // cap 1: the machine's next tick may have moved
	done  chan struct{} // closed by Close
	// procs counts the process goroutines (run, stop, a failed start's
	// report); wg the timer loop and the starter, which ends (stopStart)
	// only after procs.
	procWG    sync.WaitGroup
	stopStart chan struct{}
	wg        sync.WaitGroup

	mu      sync.Mutex
	m       *Machine
	files   map[string]string // model → file, the last scan
	procs   map[string]*proc
	waiters map[uint64]chan grant
	nextW   uint64
	ports   map[int]bool
	logs    map[string]*ring // the last process's log per model
	closed  bool
	// lastNotify is the last OnChange; owed, an in_flight-only step's
	// call not made yet (the timer loop makes it at lastNotify+NotifyGap).
	lastNotify time.Time
	owed       bool
}

type startReq struct {
	cmd   *exec.Cmd
	reply chan error
}

// starter forks every child from one OS thread that lives as long as the
// Backend (Pdeathsig is tied to the forking thread, SPEC U5).
func (b *Backend) starter() {
	defer b.wg.Done()
	runtime.LockOSThread() // never unlocked: the thread ends with this goroutine, after the last child
	for {
		select {
		case r := <-b.start:
			r.reply <- r.cmd.Start()
		case <-b.stopStart:
			return
		}
	}
}

// timerLoop feeds the machine its ticks: idle unloads, backoffs.
func (b *Backend) timerLoop() {
	defer b.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		b.mu.Lock()
		at, ok := b.m.Next()
		b.mu.Unlock()
		d := time.Hour
		if ok {
			d = max(time.Until(at), time.Millisecond)
		}
		b.mu.Lock()
		if b.owed {
			d = min(d, max(time.Until(b.lastNotify.Add(NotifyGap)), time.Millisecond))
		}
		b.mu.Unlock()
		t.Reset(d)
		select {
		case <-t.C:
			b.mu.Lock()
			b.step(Event{Kind: EvTick}) // notifies, paying what is owed
			b.mu.Unlock()
		case <-b.kick:
		case <-b.done:
			return
		}
	}
}

// step applies ev to the machine and carries out its effects; b.mu held.
func (b *Backend) step(ev Event) {
	ev.Now = time.Now()
	inflightOnly := ev.Kind == EvRequest || ev.Kind == EvDone
	for _, fx := range b.m.Step(ev) {
		inflightOnly = inflightOnly && fx.Kind == FxGrant
		switch fx.Kind {
		case FxGrant:
			port := 0
			if p := b.procs[fx.Model]; p != nil {
				port = p.port
			}
			b.answer(fx.Waiter, grant{port: port})
		case FxFail:
			b.answer(fx.Waiter, grant{err: fmt.Errorf("%w: managed %q, model %q: %s", ErrUnavailable, b.cfg.Name, fx.Model, fx.Reason)})
		case FxStart:
			b.launch(fx.Model)
		case FxStop:
			if p := b.procs[fx.Model]; p != nil {
				b.log.Info("managed model stopping", "model", fx.Model, "reason", fx.Reason, "port", p.port)
				b.stopProc(p)
			}
		}
	}
	if inflightOnly && time.Since(b.lastNotify) < NotifyGap {
		b.owed = true // the timer loop's tick at lastNotify+NotifyGap calls it
	} else {
		b.notify()
	}
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// notify calls OnChange; b.mu held.
func (b *Backend) notify() {
	b.lastNotify, b.owed = time.Now(), false
	if b.cfg.OnChange != nil {
		b.cfg.OnChange()
	}
}

func (b *Backend) answer(w uint64, g grant) {
	if ch := b.waiters[w]; ch != nil {
		delete(b.waiters, w)
		ch <- g
	}
}

func (b *Backend) done1(model string) {
	b.mu.Lock()
	b.step(Event{Kind: EvDone, Model: model})
	b.mu.Unlock()
}

// launch starts model's process on a free port and its watcher; b.mu held.
func (b *Backend) launch(model string) {
	fail := func(err error) {
		b.log.Warn("managed model failed to start", "model", model, "err", err)
		b.procWG.Add(1)
		go func() { // the machine's step cannot recurse: report from a goroutine
			defer b.procWG.Done()
			b.mu.Lock()
			b.step(Event{Kind: EvLoadFailed, Model: model, Err: err.Error()})
			b.mu.Unlock()
		}()
	}
	file, ok := b.files[model]
	if b.closed {
		fail(errors.New("the node is shutting down"))
		return
	}
	if !ok {
		fail(errors.New("no model file"))
		return
	}
	port := b.freePort()
	if port == 0 {
		fail(fmt.Errorf("no free port in port_range [%d, %d]", b.cfg.PortFirst, b.cfg.PortLast))
		return
	}
	args := make([]string, len(b.cfg.Command))
	for i, a := range b.cfg.Command {
		a = strings.ReplaceAll(a, "{model}", file)
		a = strings.ReplaceAll(a, "{name}", model)
		args[i] = strings.ReplaceAll(a, "{port}", strconv.Itoa(port))
	}
	lg := newRing(b.cfg.LogBytes)
	cmd := exec.Command(args[0], args[1:]...) // never a shell (SPEC U5)
	cmd.Env = childEnv(b.cfg.Env)
	cmd.Stdout, cmd.Stderr = lg, lg
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &proc{model: model, port: port, cmd: cmd, log: lg, started: make(chan struct{}), exited: make(chan struct{})}
	b.procs[model], b.logs[model], b.ports[port] = p, lg, true
	b.procWG.Add(1)
	go b.run(p)
}

// run starts p, polls its health path until ready, then watches it until
// it exits, reporting each to the machine.
func (b *Backend) run(p *proc) {
	defer b.procWG.Done()
	reply := make(chan error, 1)
	b.start <- startReq{cmd: p.cmd, reply: reply}
	if err := <-reply; err != nil {
		close(p.started)
		close(p.exited)
		b.finish(p, EvLoadFailed, "start: "+err.Error())
		return
	}
	p.pid = p.cmd.Process.Pid
	close(p.started)
	b.log.Info("managed model starting", "model", p.model, "pid", p.pid, "port", p.port)
	go func() { // owned by run: it waits for exited below on every path
		p.exitErr = p.cmd.Wait()
		close(p.exited)
	}()
	if err := b.waitReady(p); err != nil {
		b.kill(p)
		<-p.exited
		b.log.Warn("managed model failed to load", "model", p.model, "err", err) // SPEC U5: on the node's own log too
		b.finish(p, EvLoadFailed, err.Error())
		return
	}
	b.mu.Lock()
	b.step(Event{Kind: EvReady, Model: p.model})
	b.mu.Unlock()
	b.log.Info("managed model loaded", "model", p.model, "port", p.port)
	<-p.exited
	b.mu.Lock()
	stopping := p.stopping
	b.mu.Unlock()
	if stopping {
		return // stopProc reports EvStopped
	}
	b.log.Warn("managed model exited", "model", p.model, "err", exitText(p.exitErr), "last_log", p.log.LastLines(lastLines))
	b.finish(p, EvExited, exitText(p.exitErr)+lastLog(p.log))
}

// finish forgets p (its process is gone) and reports kind.
func (b *Backend) finish(p *proc, kind EventKind, why string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.procs[p.model] == p {
		delete(b.procs, p.model)
	}
	delete(b.ports, p.port)
	b.step(Event{Kind: kind, Model: p.model, Err: why})
}

// waitReady polls p's health path until it answers 200, p exits, the
// ready timeout passes or the backend closes.
func (b *Backend) waitReady(p *proc) error {
	deadline := time.NewTimer(b.cfg.ReadyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(b.cfg.HealthPoll)
	defer tick.Stop()
	u := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) + b.cfg.HealthPath
	for {
		select {
		case <-p.exited:
			return fmt.Errorf("exited before ready: %s%s", exitText(p.exitErr), lastLog(p.log))
		case <-deadline.C:
			return fmt.Errorf("not ready within ready_timeout_ms (%d)%s", b.cfg.ReadyTimeout.Milliseconds(), lastLog(p.log))
		case <-b.done:
			return errors.New("the node is shutting down")
		case <-tick.C:
		}
		resp, err := b.hc.Get(u)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
}

// stopProc stops p: SIGTERM to its group, SIGKILL after the grace, then
// EvStopped; b.mu held.
func (b *Backend) stopProc(p *proc) {
	if p.stopping {
		return
	}
	p.stopping = true
	b.procWG.Add(1)
	go func() {
		defer b.procWG.Done()
		<-p.started
		if p.pid > 0 {
			_ = syscall.Kill(-p.pid, syscall.SIGTERM)
		}
		t := time.NewTimer(b.cfg.StopGrace)
		defer t.Stop()
		select {
		case <-p.exited:
		case <-t.C:
			b.log.Warn("managed model ignored SIGTERM; killing it", "model", p.model, "grace", b.cfg.StopGrace)
			b.kill(p)
			<-p.exited
		}
		b.log.Info("managed model stopped", "model", p.model)
		b.finish(p, EvStopped, "")
	}()
}

// kill sends SIGKILL to p's process group.
func (b *Backend) kill(p *proc) {
	if p.pid > 0 {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
}

// freePort is the first port of the range no process of this backend
// holds and nothing else listens on; 0 = none; b.mu held.
func (b *Backend) freePort() int {
	for port := b.cfg.PortFirst; port <= b.cfg.PortLast; port++ {
		if b.ports[port] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		ln.Close()
		return port
	}
	return 0
}

// childEnv is what a managed process inherits from the node: PATH, HOME,
// the locale, TMPDIR and the GPU runtimes' variables (CUDA_*, HIP_*,
// ROCR_*, GGML_*, LD_LIBRARY_PATH), then extra (managed[].env); nothing
// else — the node's environment may hold upstream keys
// (api_key_env_allow).
func childEnv(extra map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH", k == "HOME", k == "LANG", k == "TMPDIR", k == "LD_LIBRARY_PATH", strings.HasPrefix(k, "LC_"),
			strings.HasPrefix(k, "CUDA_"), strings.HasPrefix(k, "HIP_"), strings.HasPrefix(k, "ROCR_"), strings.HasPrefix(k, "GGML_"):
			env = append(env, kv)
		}
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+extra[k])
	}
	return env
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// lastLines is how many of a failed process's last log lines its error
// and the node's log quote (SPEC U5).
const lastLines = 4

func lastLog(r *ring) string {
	if l := r.LastLines(lastLines); l != "" {
		return "; last log lines: " + l
	}
	return ""
}
