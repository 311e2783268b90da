package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

var (
	wrkRPS    = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkTotal  = regexp.MustCompile(`(\d+) requests in`)
	wrkNon2xx = regexp.MustCompile(`Non-2xx or 3xx responses:\s+(\d+)`)
	wrkSocket = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

// cmdWrk runs Debian's wrk closed loop (-t2 -c64 by default) against the
// target and records its Requests/sec, the failures it counted, and the CPU
// per request of the sampled processes. wrk checks status codes only; the
// body is the same one the open-loop runs check.
func cmdWrk(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("wrk", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	var t target
	c.register(fs)
	t.register(fs)
	threads := fs.Int("threads", 2, "wrk -t")
	conns := fs.Int("conns", 64, "wrk -c")
	dur := fs.Duration("duration", 5*time.Second, "wrk -d")
	wrkBin := fs.String("wrk", "wrk", "wrk binary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := t.check(c.key); err != nil {
		return err
	}
	script, err := os.CreateTemp("", "iopbench-*.lua")
	if err != nil {
		return err
	}
	defer os.Remove(script.Name())
	var lua strings.Builder
	lua.WriteString("wrk.method = \"POST\"\n")
	fmt.Fprintf(&lua, "wrk.body = [==[%s]==]\n", t.body)
	for k, v := range t.header() {
		fmt.Fprintf(&lua, "wrk.headers[%q] = %q\n", k, v[0])
	}
	if _, err := script.WriteString(lua.String()); err != nil {
		return err
	}
	script.Close()

	cpu, err := startCPU(c.pids)
	if err != nil {
		return err
	}
	start := time.Now()
	var out bytes.Buffer
	cmd := exec.Command(*wrkBin, "-t"+strconv.Itoa(*threads), "-c"+strconv.Itoa(*conns),
		"-d"+strconv.Itoa(int(dur.Seconds()))+"s", "--timeout", "10s", "-s", script.Name(), t.url)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("wrk: %v: %s", err, out.String())
	}
	elapsed := time.Since(start)
	rps, total, failures, err := parseWrk(out.String())
	if err != nil {
		return err
	}
	bad := 0
	for _, v := range failures {
		bad += v
	}
	sysPerReq := cpu.syscallsPerRequest(total)
	perReq, err := cpu.perRequest(total)
	if err != nil {
		return err
	}
	return emit(stdout, record{
		Kind: "wrk", Path: c.path, Round: c.round, Seconds: elapsed.Seconds(),
		Requests: total, OK: max(0, total-bad), RPS: rps, CPUPerReq: perReq, SysPerReq: sysPerReq, Failures: failures,
	})
}

// ErrWrkOutput: wrk's report did not have the Requests/sec and total lines.
var ErrWrkOutput = errors.New("wrk output not understood")

// parseWrk reads wrk's text report: Requests/sec, the total request count,
// and the failures it lists (non-2xx/3xx answers, socket errors by kind).
func parseWrk(out string) (rps float64, total int, failures map[string]int, err error) {
	m := wrkRPS.FindStringSubmatch(out)
	n := wrkTotal.FindStringSubmatch(out)
	if m == nil || n == nil {
		return 0, 0, nil, fmt.Errorf("%w: %.300s", ErrWrkOutput, out)
	}
	rps, _ = strconv.ParseFloat(m[1], 64)
	total, _ = strconv.Atoi(n[1])
	failures = map[string]int{}
	if f := wrkNon2xx.FindStringSubmatch(out); f != nil {
		failures["non_2xx"], _ = strconv.Atoi(f[1])
	}
	if f := wrkSocket.FindStringSubmatch(out); f != nil {
		for i, k := range []string{"connect", "read", "write", "timeout"} {
			if v, _ := strconv.Atoi(f[i+1]); v > 0 {
				failures[k] = v
			}
		}
	}
	return rps, total, failures, nil
}
