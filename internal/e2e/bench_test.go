package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// readyCounter is an slog.Handler that counts the Edge's "node ready"
// records (one per first ready transition, SPEC L5) and closes all when
// want of them arrived. It keeps nothing else, so it does not disturb heap
// measurements.
type readyCounter struct {
	n    atomic.Int64
	want int64
	all  chan struct{}
}

func newReadyCounter(want int) *readyCounter {
	return &readyCounter{want: int64(want), all: make(chan struct{})}
}

func (h *readyCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *readyCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "node ready" && h.n.Add(1) == h.want {
		close(h.all)
	}
	return nil
}

func (h *readyCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *readyCounter) WithGroup(string) slog.Handler      { return h }

// heapInuse returns HeapInuse and StackInuse after two GCs.
func heapInuse() (heap, stack uint64) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse, m.StackInuse
}

// fleetSize returns how many nodes the open-file limit allows, at most want:
// each node costs two descriptors in this process (its side and the Edge's).
func fleetSize(b *testing.B, want int) int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		b.Fatalf("getrlimit: %v", err)
	}
	const reserve = 256
	need := uint64(2*want + reserve)
	if rl.Cur >= need {
		return want
	}
	n := int((rl.Cur - reserve) / 2)
	if rl.Cur < reserve+20 {
		b.Skipf("open-file limit %d is too low for this benchmark (raise it with ulimit -n %d)", rl.Cur, need)
	}
	b.Logf("open-file limit %d is below the %d that %d nodes need: running %d nodes instead (raise it with ulimit -n %d)",
		rl.Cur, need, want, n, need)
	return n
}

// BenchmarkThousandNodesReady (L5): 1,000 nodes dial one Edge over
// loopback mutual TLS at once. Two variants:
//
//   - nodes=in-process: the nodes run as goroutines of this process, next
//     to the Edge. heap-B/node is HeapInuse growth ÷ nodes once all are
//     ready and idle (after GC) and so counts BOTH ends of every
//     connection, TLS buffers included: an upper bound of the Edge's share.
//   - nodes=child-process: the same 1,000 nodes run in a child process (this
//     test binary, see TestMain), so this process holds the Edge alone and
//     edge-heap-B/node is the Edge's own heap per idle ready node (target
//     ≤ 65536).
//
// ready-ms is from starting the nodes until the Edge has made every one ready
// (first ready transitions counted from its log; target ≤ 5000 on the
// 2-core machine). stack-B/node and goroutines/node are this process's.
//
// Run: go test -run '^$' -bench BenchmarkThousandNodesReady -benchtime 1x ./internal/e2e/
func BenchmarkThousandNodesReady(b *testing.B) {
	b.Run("nodes=in-process", func(b *testing.B) { benchFleet(b, false) })
	b.Run("nodes=child-process", func(b *testing.B) { benchFleet(b, true) })
}

func benchFleet(b *testing.B, child bool) {
	leakcheck.Check(b)
	n := fleetSize(b, 1000)
	ids := nodeIDs(n)
	p := newPKI(b, ids...)
	bp := startBackend(b, backend.Options{})
	url := bp.serve(b, nil)
	cfg := fleetConfig(b, p, ids, url)
	hc := newHTTPClient(b)
	heapMetric := "heap-B/node"
	if child {
		heapMetric = "edge-heap-B/node"
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		rc := newReadyCounter(n)
		e := startEdge(b, cfg, nil, slog.New(rc))
		var fleet *childFleet
		if child {
			fleet = startChildFleet(b, p, e.nodeAddr, n)
		}
		g0 := runtime.NumGoroutine()
		heap0, stack0 := heapInuse()
		nodes := make([]*nodeProc, 0, n)
		b.StartTimer()
		start := time.Now()
		if child {
			fleet.start(b)
		} else {
			for _, id := range ids {
				nodes = append(nodes, startNodeNoCleanup(b, p, id, e.nodeAddr, nodeOpts{client: hc}))
			}
		}
		select {
		case <-rc.all:
		case <-time.After(60 * time.Second):
			b.Errorf("only %d of %d nodes ready after 60 s", rc.n.Load(), n)
		}
		ready := time.Since(start)
		b.StopTimer()
		heap1, stack1 := heapInuse()
		g1 := runtime.NumGoroutine()
		b.ReportMetric(float64(ready.Milliseconds()), "ready-ms")
		b.ReportMetric(float64(int64(heap1)-int64(heap0))/float64(n), heapMetric)
		b.ReportMetric(float64(int64(stack1)-int64(stack0))/float64(n), "stack-B/node")
		b.ReportMetric(float64(g1-g0)/float64(n), "goroutines/node")
		b.Logf("%d nodes ready in %v; this process: heap +%d KiB, stacks +%d KiB, goroutines +%d",
			n, ready.Round(time.Millisecond), (int64(heap1)-int64(heap0))>>10, (int64(stack1)-int64(stack0))>>10, g1-g0)

		if child {
			fleet.stop(b)
		}
		var wg sync.WaitGroup
		for _, nd := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := nd.stop(); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
		if err := e.stop(); err != nil {
			b.Error(err)
		}
		b.StartTimer()
	}
}

// childFleet is a child process running nodes (runFleet).
type childFleet struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startChildFleet starts the helper and waits until it is ready to start
// its n nodes against edgeAddr.
func startChildFleet(b *testing.B, p pkiDir, edgeAddr string, n int) *childFleet {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d", fleetHelperEnv, p, edgeAddr, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	f := &childFleet{cmd: cmd, stdin: stdin}
	b.Cleanup(func() { f.stop(b) })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "waiting\n" {
		b.Fatalf("fleet helper said %q: %v", line, err)
	}
	return f
}

func (f *childFleet) start(b *testing.B) {
	if _, err := io.WriteString(f.stdin, "go\n"); err != nil {
		b.Fatal(err)
	}
}

// stop closes the helper's stdin (it stops its nodes and exits) and waits
// up to 20 s before killing it; idempotent.
func (f *childFleet) stop(b *testing.B) {
	if f.stdin == nil {
		return
	}
	f.stdin.Close()
	f.stdin = nil
	done := make(chan error, 1)
	go func() { done <- f.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			b.Errorf("fleet helper: %v", err)
		}
	case <-time.After(20 * time.Second):
		f.cmd.Process.Kill()
		<-done
		b.Errorf("fleet helper did not exit within 20 s of its stdin closing")
	}
}

// roundTrip is one Edge, one node and the demo backend for the round-trip
// benchmarks.
func roundTrip(b *testing.B, adapter config.Adapter, target string) (*apiClient, []byte) {
	leakcheck.Check(b)
	p := newPKI(b, "gpu-1")
	bp := startBackend(b, backend.Options{})
	url := bp.serve(b, nil)
	adapter.BaseURL = url
	cfg := edgeConfig(b, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{adapter}}},
		[]config.Model{modelGroup("tiny", provider("gpu-1", adapter.Name, target))}, nil)
	e := startEdge(b, cfg, nil, nil)
	startNode(b, p, "gpu-1", e.nodeAddr, nodeOpts{})
	newAdminClient(b, e).waitConnected(b, 10*time.Second, "gpu-1")
	return newAPIClient(b, e), chatRequest{model: "tiny"}.body()
}

// benchChat posts body to the Edge b.N times, one at a time, and drains
// each answer. ns/op is one full round trip (client → Edge HTTP → frames →
// node → demo backend → back); allocs/op counts every allocation in the
// process: client, Edge, node and backend; cpu-µs/op is the process's
// user+system CPU time per round trip (getrusage), which a loaded machine
// distorts less than ns/op.
func benchChat(b *testing.B, c *apiClient, body []byte) {
	b.ReportAllocs()
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	defer func() {
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
		cpu := time.Duration(ru1.Utime.Nano()-ru0.Utime.Nano()) + time.Duration(ru1.Stime.Nano()-ru0.Stime.Nano())
		b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
	}()
	b.ResetTimer()
	for range b.N {
		resp, err := c.hc.Post(c.url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d, read error %v", resp.StatusCode, err)
		}
	}
}

// BenchmarkTunnelRoundTrip: non-stream chat through an openai_compat
// adapter (raw tunnel path, SPEC T1, T2).
func BenchmarkTunnelRoundTrip(b *testing.B) {
	c, body := roundTrip(b, compatAdapter("oa", "", 4), "tiny")
	benchChat(b, c, body)
}

// BenchmarkRunRoundTrip: non-stream chat through an ollama adapter
// (normalized run path, SPEC E3, E8).
func BenchmarkRunRoundTrip(b *testing.B) {
	c, body := roundTrip(b, ollamaAdapter("ollama", "", 4), "tiny")
	benchChat(b, c, body)
}
