package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// cmdConc is the closed loop with a fixed request count and concurrency
// (the resilience run: 1,000 requests at concurrency 10): c workers each send the
// next request as soon as their previous one ended, until n were sent.
// Latency is from sending to the last body byte; a request is OK when it
// got 200 and a body containing -expect. Percentiles are exact (nearest
// rank over every request, failed ones included); failures are counted by
// status or kind with a few of their texts.
func cmdConc(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("conc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	var t target
	c.register(fs)
	t.register(fs)
	n := fs.Int("n", 1000, "requests in all")
	conc := fs.Int("c", 10, "requests in flight at once")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := t.check(c.key); err != nil {
		return err
	}
	if *n < 1 || *conc < 1 {
		return fmt.Errorf("-n and -c must be positive")
	}
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        *conc,
		MaxIdleConnsPerHost: *conc,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
	defer client.CloseIdleConnections()
	cpu, err := startCPU(c.pids)
	if err != nil {
		return err
	}
	lat := make([]time.Duration, *n)
	okv := make([]bool, *n)
	var errs errSet
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				lat[i], okv[i] = concOne(client, &t, &errs)
			}
		}()
	}
	for i := range *n {
		next <- i
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	ok := 0
	for _, v := range okv {
		if v {
			ok++
		}
	}
	sysPerReq := cpu.syscallsPerRequest(*n)
	perReq, err := cpu.perRequest(*n)
	if err != nil {
		return err
	}
	sortDurations(lat)
	return emit(stdout, record{
		Kind: "conc", Path: c.path, Round: c.round, Rate: *conc,
		Seconds: elapsed.Seconds(), Requests: *n, OK: ok, RPS: float64(*n) / elapsed.Seconds(),
		P50: us(quantile(lat, 0.50)), P90: us(quantile(lat, 0.90)), P99: us(quantile(lat, 0.99)), Max: us(quantile(lat, 1)),
		CPUPerReq: perReq, SysPerReq: sysPerReq, Failures: errs.counts, Errors: errs.texts,
	})
}

// concOne sends one request and reads its whole answer.
func concOne(client *http.Client, t *target, errs *errSet) (time.Duration, bool) {
	req, err := http.NewRequest(http.MethodPost, t.url, bytes.NewReader(t.body))
	if err != nil {
		errs.add("request", err.Error())
		return 0, false
	}
	req.Header = t.header()
	begin := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		errs.add("transport", err.Error())
		return time.Since(begin), false
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(begin)
	switch {
	case err != nil:
		errs.add("read", err.Error())
	case resp.StatusCode != http.StatusOK:
		errs.add(fmt.Sprintf("http_%d", resp.StatusCode), string(body[:min(len(body), 200)]))
	case !bytes.Contains(body, t.expect):
		errs.add("body", string(body[:min(len(body), 200)]))
	default:
		return d, true
	}
	return d, false
}
