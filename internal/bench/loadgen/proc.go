package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrProc: /proc/<pid>/stat or status could not be read or parsed.
var ErrProc = errors.New("proc")

// clockTicksPerSec is USER_HZ, 100 on every Linux amd64/arm64 kernel (the
// unit of utime/stime in /proc/<pid>/stat, proc(5)).
const clockTicksPerSec = 100

// common are the flags every measuring subcommand takes.
type common struct {
	path  string
	round int
	key   string
	pids  map[string]int
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.path, "path", "", "label of the measured path (a, a2, b, c, d, ck, dk)")
	fs.IntVar(&c.round, "round", 1, "round number")
	fs.StringVar(&c.key, "key", "", "Bearer key (empty = no Authorization header)")
	fs.Func("pids", "edge=PID,node=PID: processes whose CPU and memory are sampled", func(s string) error {
		m, err := parsePids(s)
		c.pids = m
		return err
	})
}

func parsePids(s string) (map[string]int, error) {
	m := map[string]int{}
	for _, kv := range strings.Split(s, ",") {
		if kv == "" {
			continue
		}
		name, v, ok := strings.Cut(kv, "=")
		pid, err := strconv.Atoi(v)
		if !ok || err != nil || pid <= 0 {
			return nil, fmt.Errorf("-pids: %q is not name=PID", kv)
		}
		m[name] = pid
	}
	return m, nil
}

// cpuTicks is utime+stime of pid in clock ticks (proc(5) fields 14 and 15).
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrProc, err)
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("%w: /proc/%d/stat has no ')'", ErrProc, pid)
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("%w: /proc/%d/stat has %d fields", ErrProc, pid, len(f)+2)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%w: /proc/%d/stat utime/stime not numbers", ErrProc, pid)
	}
	return ut + st, nil
}

// memKiB returns VmRSS and VmHWM of pid in KiB.
func memKiB(pid int) (rss, hwm uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %v", ErrProc, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseUint(f[0], 10, 64)
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			hwm = n
		}
	}
	return rss, hwm, nil
}

// syscalls returns the read-class and write-class system calls pid made
// (syscr, syscw in /proc/<pid>/io, proc(5)); recvmsg/sendmsg count too.
func syscalls(pid int) (r, w uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %v", ErrProc, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		switch k {
		case "syscr":
			r = n
		case "syscw":
			w = n
		}
	}
	return r, w, nil
}

// cpuMeter measures utime+stime and syscall-count deltas of the sampled
// processes.
type cpuMeter struct {
	pids       map[string]int
	start      map[string]uint64
	sysr, sysw map[string]uint64
}

func startCPU(pids map[string]int) (*cpuMeter, error) {
	m := &cpuMeter{pids: pids, start: map[string]uint64{}, sysr: map[string]uint64{}, sysw: map[string]uint64{}}
	for name, pid := range pids {
		t, err := cpuTicks(pid)
		if err != nil {
			return nil, err
		}
		m.start[name] = t
		m.sysr[name], m.sysw[name], _ = syscalls(pid) // /proc/<pid>/io needs the same user; 0 otherwise
	}
	return m, nil
}

// syscallsPerRequest returns read and write syscalls per request since
// startCPU, keyed "<proc>_r" and "<proc>_w".
func (m *cpuMeter) syscallsPerRequest(requests int) map[string]float64 {
	if len(m.pids) == 0 || requests <= 0 {
		return nil
	}
	out := map[string]float64{}
	for name, pid := range m.pids {
		r, w, err := syscalls(pid)
		if err != nil {
			continue
		}
		out[name+"_r"] = float64(r-m.sysr[name]) / float64(requests)
		out[name+"_w"] = float64(w-m.sysw[name]) / float64(requests)
	}
	return out
}

// perRequest returns CPU µs per request since startCPU, per process.
func (m *cpuMeter) perRequest(requests int) (map[string]float64, error) {
	if len(m.pids) == 0 || requests <= 0 {
		return nil, nil
	}
	out := map[string]float64{}
	for name, pid := range m.pids {
		t, err := cpuTicks(pid)
		if err != nil {
			return nil, err
		}
		usec := float64(t-m.start[name]) * 1e6 / clockTicksPerSec
		out[name] = usec / float64(requests)
	}
	return out, nil
}

func sampleMem(pids map[string]int) (rss, hwm map[string]uint64, err error) {
	if len(pids) == 0 {
		return nil, nil, nil
	}
	rss, hwm = map[string]uint64{}, map[string]uint64{}
	for name, pid := range pids {
		r, h, err := memKiB(pid)
		if err != nil {
			return nil, nil, err
		}
		rss[name], hwm[name] = r, h
	}
	return rss, hwm, nil
}

func cmdMem(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mem", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	label := fs.String("label", "idle", "what the sample is (idle, end)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rss, hwm, err := sampleMem(c.pids)
	if err != nil {
		return err
	}
	return emit(stdout, record{Kind: "mem", Label: *label, Round: c.round, RSS: rss, HWM: hwm})
}

// quantile of sorted durations, nearest rank.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

func sortDurations(d []time.Duration) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
}

// errSet keeps a few distinct error texts and a count per kind.
type errSet struct {
	mu     sync.Mutex
	counts map[string]int
	texts  []string
}

func (e *errSet) add(kind, text string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.counts == nil {
		e.counts = map[string]int{}
	}
	e.counts[kind]++
	if len(e.texts) < 5 && !contains(e.texts, text) {
		e.texts = append(e.texts, text)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// sleepUntil waits for t; loops here are bounded by the caller's schedule.
func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}
