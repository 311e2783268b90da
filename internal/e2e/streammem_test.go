package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// streamPeersEnv, when set, turns BenchmarkSlowStreamMemory in a child test
// binary into the peers of the parent's Edge: the demo backend, the node and
// the streaming clients (runStreamPeers). The value is a JSON peerSpec.
const streamPeersEnv = "IOP_E2E_STREAM_PEERS"

// slowStreams is how many streams BenchmarkSlowStreamMemory holds open at
// once; the two processes need about 2 and 6 descriptors per stream.
const slowStreams = 2000

// slowTokenDelay is the demo backend's wait before each token: one token a
// second, as in BENCHMARKS.md's slow-stream runs.
const slowTokenDelay = time.Second

// peerSpec configures the peer process.
type peerSpec struct {
	PKI     string `json:"pki"`
	Model   string `json:"model"`   // the backend model the clients ask for
	Streams int    `json:"streams"` // concurrent streams to open
}

// BenchmarkSlowStreamMemory (target: ≤ 32 KiB of Edge RSS per in-flight
// stream beyond idle) holds slowStreams streaming chat completions open
// through one Edge, one node and the demo backend (tiny-loop, one token a
// second, never ending on its own) and measures what the Edge holds per
// stream once every client has its first SSE event.
//
// The node, the backend and the clients run in a child process (this test
// binary, see runStreamPeers), so this process holds the Edge alone and its
// figures are the Edge's own, per stream, beyond the idle Edge with its node
// connected:
//
//   - heap-B/stream: HeapInuse growth after two GCs;
//   - stack-B/stream: StackInuse growth;
//   - goroutines/stream: runtime.NumGoroutine growth;
//   - rss-B/stream: VmRSS growth from an idle Edge whose free memory went
//     back to the OS (GC headroom included; the figure the
//     target is for);
//   - open-ms: from the first request until every client had its first event.
//
// Sub-benchmarks: path=tunnel (openai_compat provider, SPEC T1/T2) and
// path=run (ollama provider, SPEC E3/T5). Every stream is closed by its
// client at the end and the Edge must release every lease (Q2) and leave no
// goroutine behind.
//
// With -memprofile P (add -memprofilerate 1 for exact figures) the in-use
// heap at the hold point is also written to P.<path>.hold, and the
// goroutine stacks to P.<path>.goroutines.txt: the profile the testing
// package writes to P itself is taken after the streams ended.
//
// Run: go test -run '^$' -bench SlowStreamMemory -benchtime 1x ./internal/e2e/
func BenchmarkSlowStreamMemory(b *testing.B) {
	if spec, ok := os.LookupEnv(streamPeersEnv); ok {
		if err := runStreamPeers(spec, os.Stdin, os.NewFile(3, "replies")); err != nil {
			b.Fatalf("stream peers: %v", err)
		}
		return
	}
	for _, tc := range []struct {
		name    string
		adapter func(url string, capacity int) config.Adapter
	}{
		{"tunnel", func(url string, n int) config.Adapter { return compatAdapter("oa", url, n) }},
		{"run", func(url string, n int) config.Adapter { return ollamaAdapter("ollama", url, n) }},
	} {
		b.Run("path="+tc.name, func(b *testing.B) { benchSlowStreams(b, tc.name, tc.adapter) })
	}
}

func benchSlowStreams(b *testing.B, name string, adapter func(url string, capacity int) config.Adapter) {
	leakcheck.Check(b)
	n := fleetSize(b, slowStreams) // one descriptor per stream here, several in the child
	p := newPKI(b, "gpu-1")
	for range b.N {
		b.StopTimer()
		peers := startStreamPeers(b, peerSpec{PKI: string(p), Model: "tiny-loop", Streams: n})
		url := peers.ask(b, "", 30*time.Second, "backend ")
		cfg := edgeConfig(b, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{adapter(url, n)}}},
			[]config.Model{modelGroup("tiny", provider("gpu-1", adapter(url, n).Name, "tiny-loop"))}, func(c *config.Config) {
				w := n
				c.Queue.MaxWaiters = &w
			})
		e := startEdge(b, cfg, nil, nil)
		adm := newAdminClient(b, e)
		peers.ask(b, "node "+e.nodeAddr, 30*time.Second, "node started")
		adm.waitConnected(b, 15*time.Second, "gpu-1")

		g0 := runtime.NumGoroutine()
		heap0, stack0 := heapInuse()
		debug.FreeOSMemory() // RSS from here on counts what the streams add
		rss0 := vmRSS(b)
		b.StartTimer()
		opened := peers.ask(b, "open "+e.httpURL, 120*time.Second, "open ")
		b.StopTimer()
		rss1 := vmRSS(b)
		heap1, stack1 := heapInuse()
		g1 := runtime.NumGoroutine()
		writeHoldProfiles(b, name)

		ms, _ := strconv.Atoi(opened)
		per := func(a, z uint64) float64 { return float64(int64(z)-int64(a)) / float64(n) }
		b.ReportMetric(float64(ms), "open-ms")
		b.ReportMetric(per(heap0, heap1), "heap-B/stream")
		b.ReportMetric(per(stack0, stack1), "stack-B/stream")
		b.ReportMetric(float64(g1-g0)/float64(n), "goroutines/stream")
		b.ReportMetric(per(rss0, rss1), "rss-B/stream")
		b.Logf("%s: %d streams open in %d ms; Edge: heap +%d KiB, stacks +%d KiB, RSS +%d KiB, goroutines +%d",
			name, n, ms, (int64(heap1)-int64(heap0))>>10, (int64(stack1)-int64(stack0))>>10,
			(int64(rss1)-int64(rss0))>>10, g1-g0)

		peers.ask(b, "close", 60*time.Second, "closed")
		peers.wait(b)
		adm.waitGauges(b, 15*time.Second, 0, 0) // Q2: every lease went back
		if err := e.stop(); err != nil {
			b.Error(err)
		}
	}
}

// vmRSS returns this process's resident set size in bytes
// (/proc/self/status VmRSS).
func vmRSS(b *testing.B) uint64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skipf("no /proc/self/status: %v", err)
	}
	for line := range strings.Lines(string(raw)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS line in /proc/self/status")
	return 0
}

// writeHoldProfiles writes the in-use heap and the goroutine stacks next
// to the -memprofile file, when one was asked for.
func writeHoldProfiles(b *testing.B, name string) {
	f := flag.Lookup("test.memprofile")
	if f == nil || f.Value.String() == "" {
		return
	}
	base := f.Value.String()
	if d := flag.Lookup("test.outputdir"); d != nil && d.Value.String() != "" && !strings.HasPrefix(base, "/") {
		base = d.Value.String() + "/" + base
	}
	for _, w := range []struct {
		suffix, profile string
		debug           int
	}{{".hold", "heap", 0}, {".goroutines.txt", "goroutine", 1}} {
		path := base + "." + name + w.suffix
		out, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		err = pprof.Lookup(w.profile).WriteTo(out, w.debug)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			b.Fatalf("write %s: %v", path, err)
		}
		b.Logf("%s profile at the hold point: %s", w.profile, path)
	}
}

// streamPeers is the child process running runStreamPeers.
type streamPeers struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	replies chan string // closed when the child closes its end
	output  *bytes.Buffer
	done    chan error
}

// startStreamPeers starts the child; it is killed at cleanup if still
// running.
func startStreamPeers(b *testing.B, spec peerSpec) *streamPeers {
	raw, err := json.Marshal(spec)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^BenchmarkSlowStreamMemory$", "-test.benchtime=1x")
	cmd.Env = append(os.Environ(), streamPeersEnv+"="+string(raw))
	pr, pw, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.ExtraFiles = []*os.File{pw} // fd 3 in the child
	out := new(bytes.Buffer)
	cmd.Stdout, cmd.Stderr = out, out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	pw.Close()
	s := &streamPeers{cmd: cmd, stdin: stdin, replies: make(chan string, 4), output: out, done: make(chan error, 1)}
	go func() {
		defer close(s.replies)
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			s.replies <- sc.Text()
		}
	}()
	go func() {
		err := cmd.Wait()
		for range s.replies { // the reader ends with the child
		}
		s.done <- err
	}()
	b.Cleanup(func() {
		if s.stdin != nil {
			s.stdin.Close()
			s.stdin = nil
		}
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-s.done
			b.Errorf("stream peers did not exit within 30 s of their stdin closing")
		}
	})
	return s
}

// ask sends line (unless empty) and returns the rest of the child's next
// reply, which must start with prefix.
func (s *streamPeers) ask(b *testing.B, line string, timeout time.Duration, prefix string) string {
	b.Helper()
	if line != "" {
		if _, err := io.WriteString(s.stdin, line+"\n"); err != nil {
			b.Fatalf("tell stream peers %q: %v", line, err)
		}
	}
	select {
	case r, ok := <-s.replies:
		if !ok {
			b.Fatalf("stream peers ended before answering %q:\n%s", line, s.output)
		}
		rest, found := strings.CutPrefix(r, prefix)
		if !found {
			b.Fatalf("stream peers answered %q to %q, want %q…\n%s", r, line, prefix, s.output)
		}
		return rest
	case <-time.After(timeout):
		b.Fatalf("stream peers did not answer %q within %v", line, timeout)
		return ""
	}
}

// wait closes the child's stdin and waits for it to exit cleanly.
func (s *streamPeers) wait(b *testing.B) {
	s.stdin.Close()
	s.stdin = nil
	select {
	case err := <-s.done:
		if err != nil {
			b.Errorf("stream peers: %v\n%s", err, s.output)
		}
		s.done <- err // for the cleanup
	case <-time.After(30 * time.Second):
		b.Errorf("stream peers did not exit within 30 s")
	}
}

// runStreamPeers is the child's side. It serves the demo backend and
// replies "backend <url>"; on "node <addr>" it starts node gpu-1 against
// that Edge address; on "open <url>" it opens spec.Streams streaming chat
// completions and replies "open <ms>" once each has its first SSE event;
// on "close" (or the end of in) it closes every stream, stops the node and
// the backend and replies "closed".
func runStreamPeers(raw string, in io.Reader, out io.Writer) error {
	var spec peerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return fmt.Errorf("bad %s: %w", streamPeersEnv, err)
	}
	bk, err := backend.New(backend.Options{TokenDelay: slowTokenDelay})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	served := make(chan error, 1)
	go func() { served <- bk.Serve(ctx, ln) }()
	fmt.Fprintf(out, "backend http://%s\n", ln.Addr())

	tr := &http.Transport{MaxIdleConnsPerHost: spec.Streams, DisableCompression: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	var nd *nodeProc
	var clients sync.WaitGroup
	cctx, closeStreams := context.WithCancel(ctx)
	defer closeStreams()
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		cmd := sc.Text()
		switch {
		case strings.HasPrefix(cmd, "node "):
			cfg, err := nodeConfigFor(pkiDir(spec.PKI), "gpu-1", strings.TrimPrefix(cmd, "node "), 1, 0)
			if err != nil {
				return err
			}
			nd = launchNode(cfg, hc, nil)
			fmt.Fprintln(out, "node started")
		case strings.HasPrefix(cmd, "open "):
			ms, err := openStreams(cctx, &clients, hc, strings.TrimPrefix(cmd, "open "), spec)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "open %d\n", ms)
		case cmd == "close":
			return closePeers(closeStreams, &clients, nd, stop, served, out)
		default:
			return fmt.Errorf("unknown command %q", cmd)
		}
	}
	return closePeers(closeStreams, &clients, nd, stop, served, io.Discard)
}

// closePeers ends the clients' streams, then the node, then the backend.
func closePeers(closeStreams func(), clients *sync.WaitGroup, nd *nodeProc, stopBackend func(), served chan error, out io.Writer) error {
	closeStreams()
	clients.Wait()
	var errs []error
	if nd != nil {
		errs = append(errs, nd.stop())
	}
	stopBackend()
	errs = append(errs, <-served)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Fprintln(out, "closed")
	return nil
}

// openStreams starts spec.Streams clients of the Edge at url, each holding
// its stream until ctx ends, and returns how long it took (ms) until every
// one had its first SSE event; a client that fails before is an error.
func openStreams(ctx context.Context, clients *sync.WaitGroup, hc *http.Client, url string, spec peerSpec) (int64, error) {
	body := chatRequest{model: "tiny", stream: true, maxTokens: 1 << 20}.body()
	first := make(chan error, spec.Streams)
	start := time.Now()
	for range spec.Streams {
		clients.Add(1)
		go func() {
			defer clients.Done()
			holdStream(ctx, hc, url, body, first)
		}()
	}
	deadline := time.After(100 * time.Second)
	for i := range spec.Streams {
		select {
		case err := <-first:
			if err != nil {
				return 0, fmt.Errorf("stream %d: %w", i, err)
			}
		case <-deadline:
			return 0, fmt.Errorf("only %d of %d streams had their first event after 100 s", i, spec.Streams)
		}
	}
	return time.Since(start).Milliseconds(), nil
}

// holdStream posts body to url+"/v1/chat/completions", sends nil on first
// once the first SSE event arrived (or the error that came first), then
// reads the stream until ctx ends it.
func holdStream(ctx context.Context, hc *http.Client, url string, body []byte, first chan<- error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		first <- err
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		first <- err
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		first <- fmt.Errorf("status %d: %s", resp.StatusCode, raw)
		return
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			first <- fmt.Errorf("stream ended before its first event: %w", err)
			return
		}
		if line == "\n" || line == "\r\n" {
			break
		}
	}
	first <- nil
	_, _ = io.Copy(io.Discard, br) // until ctx ends the request
}
