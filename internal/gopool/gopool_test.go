package gopool

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"iop/internal/leakcheck"
)

// goid is the running goroutine's id, from its stack header.
func goid() uint64 {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// wait fails t unless ch closes or yields within 10 s.
func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10 s", what)
	}
	var zero T
	return zero
}

// M2: a task after another that finished runs on the same goroutine,
// which deepened its stack in the first (the point of the pool).
func TestM2NextTaskRunsOnTheKeptGoroutine(t *testing.T) {
	leakcheck.Check(t)
	p := New(4)
	defer p.Close()
	ids := make(chan uint64, 1)
	p.Go(func() { ids <- goid() })
	first := wait(t, ids, "first task")
	for p.Idle() != 1 { // the goroutine goes idle just after the task returns
		runtime.Gosched()
	}
	for i := range 5 {
		p.Go(func() { ids <- goid() })
		if got := wait(t, ids, "next task"); got != first {
			t.Fatalf("task %d ran on goroutine %d, want the kept %d", i, got, first)
		}
		for p.Idle() != 1 {
			runtime.Gosched()
		}
	}
}

// M2: Go never waits for a running task: with every goroutine busy a new
// one starts; once they finish at most maxIdle are kept, the rest end.
func TestM2NeverQueuesKeepsAtMostMaxIdle(t *testing.T) {
	leakcheck.Check(t)
	before := runtime.NumGoroutine()
	p := New(3)
	release := make(chan struct{})
	var started, done sync.WaitGroup
	for range 10 {
		started.Add(1)
		done.Add(1)
		p.Go(func() {
			defer done.Done()
			started.Done()
			<-release
		})
	}
	all := make(chan struct{})
	go func() { started.Wait(); close(all) }()
	wait(t, all, "10 tasks running at once")
	close(release)
	done.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for p.Idle() != 3 || runtime.NumGoroutine() != before+3 {
		if time.Now().After(deadline) {
			t.Fatalf("idle %d, goroutines %d; want 3 kept, %d", p.Idle(), runtime.NumGoroutine(), before+3)
		}
		runtime.Gosched()
	}
	p.Close()
	if n := runtime.NumGoroutine(); n != before {
		t.Fatalf("%d goroutines after Close, want %d", n, before)
	}
}

// M2: Close ends the idle goroutines and returns only after a running task
// returned; a task given after Close still runs.
func TestM2CloseWaitsForRunningTasks(t *testing.T) {
	leakcheck.Check(t)
	p := New(2)
	p.Go(func() {}) // one idle after it
	release, running := make(chan struct{}), make(chan struct{})
	p.Go(func() { close(running); <-release })
	wait(t, running, "task")
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a task ran")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	wait(t, closed, "Close after the task returned")
	if p.Idle() != 0 {
		t.Fatalf("%d idle after Close", p.Idle())
	}
	ran := make(chan struct{})
	p.Go(func() { close(ran) })
	wait(t, ran, "a task after Close")
	p.Close()
}

// M2: maxIdle 0 keeps nothing: each task ends its goroutine.
func TestM2NoIdle(t *testing.T) {
	leakcheck.Check(t)
	p := New(0)
	defer p.Close()
	ids := make(chan uint64)
	for range 3 {
		p.Go(func() { ids <- goid() })
		wait(t, ids, "task")
	}
	if p.Idle() != 0 {
		t.Fatalf("%d idle with maxIdle 0", p.Idle())
	}
}

// Many goroutines giving tasks at once: each runs exactly once.
func TestConcurrentGo(t *testing.T) {
	leakcheck.Check(t)
	p := New(8)
	var mu sync.Mutex
	n := 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				var done sync.WaitGroup
				done.Add(1)
				p.Go(func() { mu.Lock(); n++; mu.Unlock(); done.Done() })
				done.Wait()
			}
		})
	}
	wg.Wait()
	p.Close()
	if n != 8*500 {
		t.Fatalf("%d tasks ran, want %d", n, 8*500)
	}
}

// BenchmarkGo: a task handed to a kept goroutine against a new goroutine
// per task, each task growing its stack to ~16 KiB (the node's run and call
// goroutines need about that).
func BenchmarkGo(b *testing.B) {
	task := func(done chan struct{}) func() {
		return func() { deep(16); done <- struct{}{} }
	}
	b.Run("pool", func(b *testing.B) {
		p := New(4)
		defer p.Close()
		done := make(chan struct{})
		for b.Loop() {
			p.Go(task(done))
			<-done
		}
	})
	b.Run("go", func(b *testing.B) {
		done := make(chan struct{})
		for b.Loop() {
			go task(done)()
			<-done
		}
	})
}

// deep recurses n times with a 1 KiB frame each.
//
//go:noinline
func deep(n int) byte {
	var pad [1024]byte
	pad[n%len(pad)] = byte(n)
	if n == 0 {
		return pad[0]
	}
	return deep(n-1) + pad[n%len(pad)]
}
