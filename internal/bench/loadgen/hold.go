package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// cmdHold opens -streams slow streams at -ramp per second and keeps them
// open to their end (the backend's token delay makes them slow). It reports
// the most streams in flight at once (response headers received, EOF not
// yet), how many ended with every expected byte, and the RSS of the sampled
// processes just before the first stream and at the sample with the most
// streams in flight.
func cmdHold(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hold", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	var t target
	var spec streamSpec
	c.register(fs)
	t.register(fs)
	tokens := registerSpec(fs, &spec)
	n := fs.Int("streams", 1000, "concurrent streams to open")
	ramp := fs.Int("ramp", 1000, "streams opened per second")
	limit := fs.Duration("timeout", 5*time.Minute, "give up on the whole run after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := t.check(c.key); err != nil {
		return err
	}
	spec.want = expectedLoop(*tokens)
	ctx, cancel := context.WithTimeout(context.Background(), *limit)
	defer cancel()
	before, _, err := sampleMem(c.pids)
	if err != nil {
		return err
	}
	cl := streamClient(*n)
	var inflight atomic.Int64
	var best struct {
		sync.Mutex
		n   int64
		rss map[string]uint64
	}
	monDone := make(chan struct{})
	stopMon := make(chan struct{})
	go func() { // samples in-flight count and RSS every 200 ms until stopMon
		defer close(monDone)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopMon:
				return
			case <-tick.C:
			}
			cur := inflight.Load()
			best.Lock()
			if cur >= best.n && cur > 0 {
				if rss, _, err := sampleMem(c.pids); err == nil {
					best.n, best.rss = cur, rss
				}
			}
			best.Unlock()
		}
	}()
	cpu, err := startCPU(c.pids)
	if err != nil {
		return err
	}
	results := make([]streamResult, *n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range *n {
		sleepUntil(start.Add(time.Duration(i) * time.Second / time.Duration(*ramp)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = doStream(ctx, cl, &t, spec, func() { inflight.Add(1) }, func() { inflight.Add(-1) })
		}()
	}
	wg.Wait()
	close(stopMon)
	<-monDone
	elapsed := time.Since(start)
	perReq, err := cpu.perRequest(*n)
	if err != nil {
		return err
	}
	_, hwm, err := sampleMem(c.pids)
	if err != nil {
		return err
	}
	var errs errSet
	complete := 0
	for _, r := range results {
		if r.err != nil {
			errs.add(r.kind, r.err.Error())
			continue
		}
		complete++
	}
	if complete < *n {
		fmt.Fprintf(stderr, "hold %s: %d of %d streams incomplete: %v\n", c.path, *n-complete, *n, errs.counts)
	}
	return emit(stdout, record{
		Kind: "hold", Path: c.path, Round: c.round, Seconds: elapsed.Seconds(),
		Streams: *n, Held: int(best.n), Complete: complete, Requests: *n, OK: complete,
		RSSBefore: before, RSS: best.rss, HWM: hwm, CPUPerReq: perReq,
		Failures: errs.counts, Errors: errs.texts,
	})
}
