// Command iopbench is the measuring side of `./run.sh bench` (BENCHMARKS.md): the
// load generators, the stdlib one-hop reverse-proxy floor, and the report
// that turns the recorded figures into Markdown tables. It lives in its own
// module (iopbench) so that the product's go.mod stays protobuf-only; it
// imports nothing from the product and is never part of CI.
//
// Subcommands (each measurement prints one JSON line on stdout, see record):
//
//	floor   -listen ADDR -upstream URL              httputil.ReverseProxy, one hop, no parsing
//	rate    -url U -body JSON -rate N -duration D   open loop at a fixed rate (vegeta)
//	wrk     -url U -body JSON -duration D           closed loop, wrk -t2 -c64 (Debian's wrk)
//	stream  -url U -body JSON -rate N -duration D   fixed-rate streams: time to first event, total
//	hold    -url U -body JSON -streams N -ramp R    N concurrent slow streams, bytes checked, RSS
//	conc    -url U -body JSON -n N -c C             closed loop: N requests, C at a time
//	mem     -pids edge=P,node=Q -label L           VmRSS / VmHWM of the product processes
//	report  -in results.jsonl                      medians of the rounds as Markdown
//	affinity -url U -model M -label MODE            the prefix-affinity multi-turn workload: cached tokens, TTFT, requests per replica
//	slots   -url U -model M [-levels 1,2,4,8]      one backend under c concurrent streams: TTFT, time per token
//	fairness -url U -model M -probe-key K -flood L:KEY:STREAMS:MAX:WEIGHT …  a probe's latency among closed-loop floods, their shares (G1–G3)
//	batches -base U -model M -phase concurrent|batch|probe …  a batch's lines/s against a client's, a probe's TTFT beside a batch (X5)
//
// Common flags: -path (the path's label: a, a2, b, c, d; ck, dk with the credential plane on;
// e, e5, f, f5 the passive-health pairs), -round, -key
// (Bearer key, empty = none), -pids (edge=PID,node=PID: CPU µs per request
// from /proc/<pid>/stat utime+stime deltas, RSS from /proc/<pid>/status).
//
// It must never send traffic anywhere but the loopback addresses it is given;
// every loop is bounded by a duration or a count.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: iopbench floor|rate|wrk|stream|hold|mem|conc|report|affinity|slots|fairness|batches [flags]")
		return 2
	}
	cmds := map[string]func([]string, io.Writer, io.Writer) error{
		"floor":           cmdFloor,
		"rate":            cmdRate,
		"wrk":             cmdWrk,
		"stream":          cmdStream,
		"hold":            cmdHold,
		"conc":            cmdConc,
		"mem":             cmdMem,
		"report":          cmdReport,
		"affinity":        cmdAffinity,
		"slots":           cmdSlots,
		"fairness":        cmdFairness,
		"fairness-report": cmdFairnessReport,
		"batches":         cmdBatches,
		"batches-report":  cmdBatchesReport,
	}
	f, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "iopbench: unknown subcommand %q\n", args[0])
		return 2
	}
	if err := f(args[1:], stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "iopbench %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// record is one measurement, one JSON line. Durations are in µs, memory in
// KiB, CPU in µs of utime+stime.
type record struct {
	Kind  string `json:"kind"` // rate, wrk, stream, hold, conc, mem
	Path  string `json:"path,omitempty"`
	Round int    `json:"round,omitempty"`
	Label string `json:"label,omitempty"`

	Rate     int     `json:"rate,omitempty"`     // requested rate, per second (conc: concurrency)
	Seconds  float64 `json:"seconds,omitempty"`  // measured interval
	Requests int     `json:"requests,omitempty"` // sent
	OK       int     `json:"ok,omitempty"`       // answered 200 with a well-formed body
	RPS      float64 `json:"rps,omitempty"`      // achieved (rate, stream) or closed-loop (wrk)

	P50 float64 `json:"p50_us,omitempty"`
	P90 float64 `json:"p90_us,omitempty"`
	P99 float64 `json:"p99_us,omitempty"`
	Max float64 `json:"max_us,omitempty"`

	// Streams: time to first event and total time.
	FirstP50 float64 `json:"first_p50_us,omitempty"`
	FirstP99 float64 `json:"first_p99_us,omitempty"`
	FirstP90 float64 `json:"first_p90_us,omitempty"`  // affinity
	FirstAvg float64 `json:"first_mean_us,omitempty"` // affinity
	TotalP50 float64 `json:"total_p50_us,omitempty"`
	TotalP99 float64 `json:"total_p99_us,omitempty"`

	// Hold: streams asked, most in flight at once, complete with every byte.
	Streams  int            `json:"streams,omitempty"`
	Held     int            `json:"held,omitempty"`
	Complete int            `json:"complete,omitempty"`
	Failures map[string]int `json:"failures,omitempty"`

	// Per process (edge, node): CPU µs per request, and memory.
	CPUPerReq map[string]float64 `json:"cpu_us_per_req,omitempty"`
	// SysPerReq: read ("<proc>_r") and write ("<proc>_w") syscalls per request.
	SysPerReq map[string]float64 `json:"syscalls_per_req,omitempty"`
	RSSBefore map[string]uint64  `json:"rss_before_kib,omitempty"`
	RSS       map[string]uint64  `json:"rss_kib,omitempty"` // at the sample point (mem) or at peak in flight (hold)
	HWM       map[string]uint64  `json:"hwm_kib,omitempty"`

	// Affinity (R1): the backend-reported prompt and cached prompt
	// tokens summed over the run, and requests per replica (response
	// "model").
	PromptTokens int64          `json:"prompt_tokens,omitempty"`
	CachedTokens int64          `json:"cached_tokens,omitempty"`
	Replicas     map[string]int `json:"replicas,omitempty"`

	Errors []string `json:"errors,omitempty"` // a few distinct error texts
}

func emit(w io.Writer, r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
