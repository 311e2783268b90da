package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// target is what every load subcommand sends: one POST with a JSON body.
type target struct {
	url    string
	body   []byte
	key    string
	expect []byte // a 200 body must contain this to count as OK
}

func (t *target) register(fs *flag.FlagSet) {
	fs.StringVar(&t.url, "url", "", "URL to POST to")
	fs.Func("body", "JSON request body", func(s string) error { t.body = []byte(s); return nil })
	fs.Func("expect", "substring a 200 body must contain (default: assistant)", func(s string) error {
		t.expect = []byte(s)
		return nil
	})
}

func (t *target) check(key string) error {
	t.key = key
	if t.url == "" || len(t.body) == 0 {
		return fmt.Errorf("-url and -body are required")
	}
	if t.expect == nil {
		t.expect = []byte("assistant")
	}
	return nil
}

func (t *target) header() http.Header {
	h := http.Header{"Content-Type": {"application/json"}}
	if t.key != "" {
		h.Set("Authorization", "Bearer "+t.key)
	}
	return h
}

// cmdRate is the open-loop fixed-rate run (vegeta): requests leave on
// schedule whatever the answers do, so a slow answer cannot hide the ones
// queued behind it (no coordinated omission). Latency is vegeta's: from
// sending to the last body byte read. Percentiles are exact (nearest rank
// over every request, failed ones included).
func cmdRate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	var t target
	c.register(fs)
	t.register(fs)
	rate := fs.Int("rate", 1000, "requests per second")
	dur := fs.Duration("duration", 10*time.Second, "measured duration")
	warm := fs.Duration("warmup", time.Second, "unmeasured run at the same rate first")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := t.check(c.key); err != nil {
		return err
	}
	// One client for the warm-up and the measured attack (a vegeta Attacker
	// runs one attack), so the measured one starts on warm connections.
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
	newAttacker := func() *vegeta.Attacker {
		return vegeta.NewAttacker(vegeta.Client(client), vegeta.Workers(64))
	}
	tr := vegeta.NewStaticTargeter(vegeta.Target{Method: http.MethodPost, URL: t.url, Body: t.body, Header: t.header()})
	pace := vegeta.Rate{Freq: *rate, Per: time.Second}
	if *warm > 0 {
		for range newAttacker().Attack(tr, pace, *warm, "warmup") {
		}
	}
	cpu, err := startCPU(c.pids)
	if err != nil {
		return err
	}
	var lat []time.Duration
	var errs errSet
	ok := 0
	start := time.Now()
	for res := range newAttacker().Attack(tr, pace, *dur, "run") {
		lat = append(lat, res.Latency)
		switch {
		case res.Code != 0 && res.Code != http.StatusOK: // vegeta also sets Error to the status text
			errs.add(fmt.Sprintf("http_%d", res.Code), string(res.Body[:min(len(res.Body), 200)]))
		case res.Error != "":
			errs.add("transport", res.Error)
		case !bytes.Contains(res.Body, t.expect):
			errs.add("body", string(res.Body[:min(len(res.Body), 200)]))
		default:
			ok++
		}
	}
	elapsed := time.Since(start)
	sysPerReq := cpu.syscallsPerRequest(len(lat))
	perReq, err := cpu.perRequest(len(lat))
	if err != nil {
		return err
	}
	sortDurations(lat)
	return emit(stdout, record{
		Kind: "rate", Path: c.path, Round: c.round, Rate: *rate,
		Seconds: elapsed.Seconds(), Requests: len(lat), OK: ok, RPS: float64(len(lat)) / elapsed.Seconds(),
		P50: us(quantile(lat, 0.50)), P90: us(quantile(lat, 0.90)), P99: us(quantile(lat, 0.99)), Max: us(quantile(lat, 1)),
		CPUPerReq: perReq, SysPerReq: sysPerReq, Failures: errs.counts, Errors: errs.texts,
	})
}
