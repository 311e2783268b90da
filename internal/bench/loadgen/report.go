package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
)

// pathInfo names a measured path and the direct call it is compared with.
type pathInfo struct {
	id, name, base string
}

var paths = []pathInfo{
	{"a", "(a) direct: upstream /v1/chat/completions", ""},
	{"a2", "(a′) direct: upstream /api/chat (stream, as the node asks)", ""},
	{"b", "(b) floor: httputil.ReverseProxy, one hop", "a"},
	{"c", "(c) edge → node, tunnel path (openai_compat)", "a"},
	{"d", "(d) edge → node, run path (ollama → /api/chat)", "a2"},
	// ./run.sh bench creds: the same paths on a second edge and node with
	// the credential plane on (a sealed, signed lease per request), each
	// compared with its plane-off twin: Δ = the plane's added latency.
	{"ck", "(c·k) tunnel path, credential plane on", "c"},
	{"dk", "(d·k) run path, credential plane on", "d"},
}

// pairPaths are the passive-health runs: a model group of two
// providers on the same backend, both healthy (base) or the first one
// answering 503 to everything.
var pairPaths = []pathInfo{
	{"e", "tunnel path, two healthy providers", ""},
	{"e5", "tunnel path, first provider answers 503", "e"},
	{"f", "run path, two healthy providers", ""},
	{"f5", "run path, first provider answers 503", "f"},
}

type key struct {
	kind, path string
	rate       int
}

// cmdReport reads the JSON lines of a run and writes Markdown tables:
// medians over rounds, and differences (ratios) to the direct call taken
// per round, then the median of those.
func cmdReport(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("in", "", "results.jsonl")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer f.Close()
	byKey := map[key]map[int]record{}
	var mems, holds, affs, concs []record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("%s: %v", *in, err)
		}
		switch r.Kind {
		case "mem":
			mems = append(mems, r)
		case "hold":
			holds = append(holds, r)
		case "affinity":
			affs = append(affs, r)
		case "conc":
			concs = append(concs, r)
		default:
			k := key{r.Kind, r.Path, r.Rate}
			if byKey[k] == nil {
				byKey[k] = map[int]record{}
			}
			byKey[k][r.Round] = r
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	reportRate(w, byKey)
	reportWrk(w, byKey)
	reportStream(w, byKey)
	reportSys(w, byKey)
	reportPairs(w, concs)
	reportHold(w, holds)
	reportMem(w, mems)
	reportAffinity(w, affs)
	return nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// med is the median over rounds of f(record).
func med(rs map[int]record, f func(record) float64) float64 {
	var v []float64
	for _, r := range rs {
		v = append(v, f(r))
	}
	return median(v)
}

// medDiff is the median over rounds of f(path) − f(base) in the same round.
func medDiff(rs, base map[int]record, f func(record) float64) (float64, bool) {
	var v []float64
	for round, r := range rs {
		if b, ok := base[round]; ok {
			v = append(v, f(r)-f(b))
		}
	}
	return median(v), len(v) > 0
}

func medRatio(rs, base map[int]record, f func(record) float64) (float64, bool) {
	var v []float64
	for round, r := range rs {
		if b, ok := base[round]; ok && f(b) > 0 {
			v = append(v, f(r)/f(b))
		}
	}
	return median(v), len(v) > 0
}

func ms(usec float64) string { return fmt.Sprintf("%.2f", usec/1000) }

func signedMs(usec float64, ok bool) string {
	if !ok {
		return "—"
	}
	return fmt.Sprintf("%+.2f", usec/1000)
}

func success(rs map[int]record) string {
	n, ok := 0, 0
	for _, r := range rs {
		n += r.Requests
		ok += r.OK
	}
	if n == 0 {
		return "—"
	}
	if ok == n {
		return "100%"
	}
	return fmt.Sprintf("%.2f%% (%d failed)", 100*float64(ok)/float64(n), n-ok)
}

// onPath says whether process proc (edge, node, floor) serves path.
func onPath(path, proc string) bool {
	switch proc {
	case "edge", "node":
		switch path {
		case "c", "d", "ck", "dk", "e", "e5", "f", "f5":
			return true
		}
		return false
	case "floor":
		return path == "b"
	}
	return false
}

// cpuCol is the median CPU µs per request of proc; for path b the "edge"
// column shows the floor proxy's.
func cpuCol(rs map[int]record, proc string) string {
	var path string
	for _, r := range rs {
		path = r.Path
	}
	if path == "b" && proc == "edge" {
		proc = "floor"
	}
	if !onPath(path, proc) {
		return "—"
	}
	v := med(rs, func(r record) float64 { return r.CPUPerReq[proc] })
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f", v)
}

func rates(byKey map[key]map[int]record, kind string) []int {
	seen := map[int]bool{}
	for k := range byKey {
		if k.kind == kind {
			seen[k.rate] = true
		}
	}
	var out []int
	for r := range seen {
		out = append(out, r)
	}
	sort.Ints(out)
	return out
}

func reportRate(w io.Writer, byKey map[key]map[int]record) {
	rs := rates(byKey, "rate")
	if len(rs) == 0 {
		return
	}
	fmt.Fprintf(w, "### Open loop, fixed rate (vegeta)\n\nLatency in ms, median of %d round(s); Δ = this path − its direct call in the same round, median over rounds. CPU in µs per request (utime+stime).\n\n", rounds(byKey, "rate"))
	pcts := []struct {
		name string
		f    func(record) float64
	}{{"p50", func(r record) float64 { return r.P50 }}, {"p90", func(r record) float64 { return r.P90 }},
		{"p99", func(r record) float64 { return r.P99 }}, {"max", func(r record) float64 { return r.Max }}}
	for _, p := range paths {
		if !hasPath(byKey, "rate", p.id) {
			continue
		}
		fmt.Fprintf(w, "#### %s\n\n", p.name)
		hdr := "| RPS asked (achieved) | p50 | p90 | p99 | max |"
		sep := "|---|---:|---:|---:|---:|"
		if p.base != "" {
			hdr += fmt.Sprintf(" Δp50 vs %s | Δp90 | Δp99 | Δmax |", p.base)
			sep += "---:|---:|---:|---:|"
		}
		if p.id == "d" {
			hdr += " Δp50 vs a | Δp99 vs a |"
			sep += "---:|---:|"
		}
		hdr += " success | edge CPU µs/req (b: floor's) | node CPU µs/req |"
		sep += "---:|---:|---:|"
		fmt.Fprintln(w, hdr)
		fmt.Fprintln(w, sep)
		for _, rate := range rs {
			cur := byKey[key{"rate", p.id, rate}]
			if len(cur) == 0 {
				continue
			}
			row := fmt.Sprintf("| %d (%.0f) |", rate, med(cur, func(r record) float64 { return r.RPS }))
			for _, pc := range pcts {
				row += " " + ms(med(cur, pc.f)) + " |"
			}
			if p.base != "" {
				base := byKey[key{"rate", p.base, rate}]
				for _, pc := range pcts {
					row += " " + signedMs(medDiff(cur, base, pc.f)) + " |"
				}
			}
			if p.id == "d" {
				base := byKey[key{"rate", "a", rate}]
				row += " " + signedMs(medDiff(cur, base, pcts[0].f)) + " | " + signedMs(medDiff(cur, base, pcts[2].f)) + " |"
			}
			row += " " + success(cur) + " | " + cpuCol(cur, "edge") + " | " + cpuCol(cur, "node") + " |"
			fmt.Fprintln(w, row)
		}
		fmt.Fprintln(w)
	}
}

func reportWrk(w io.Writer, byKey map[key]map[int]record) {
	if rates(byKey, "wrk") == nil {
		return
	}
	fmt.Fprintf(w, "### Closed loop (wrk -t2 -c64)\n\nRequests/s, median of %d round(s); ratio = this path ÷ its direct call in the same round, median over rounds.\n\n", rounds(byKey, "wrk"))
	fmt.Fprintln(w, "| path | req/s | ratio to a | ratio to a′ | success | edge CPU µs/req (b: floor's) | node CPU µs/req |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	rps := func(r record) float64 { return r.RPS }
	for _, p := range paths {
		cur := byKey[key{"wrk", p.id, 0}]
		if len(cur) == 0 {
			continue
		}
		ra, oka := medRatio(cur, byKey[key{"wrk", "a", 0}], rps)
		rb, okb := medRatio(cur, byKey[key{"wrk", "a2", 0}], rps)
		fmt.Fprintf(w, "| %s | %.0f | %s | %s | %s | %s | %s |\n", p.name, med(cur, rps),
			pct(ra, oka), pct(rb, okb), success(cur), cpuCol(cur, "edge"), cpuCol(cur, "node"))
	}
	fmt.Fprintln(w)
}

func pct(v float64, ok bool) string {
	if !ok {
		return "—"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

func reportStream(w io.Writer, byKey map[key]map[int]record) {
	rs := rates(byKey, "stream")
	if len(rs) == 0 {
		return
	}
	fmt.Fprintf(w, "### 100-chunk streams at a fixed rate\n\nms, median of %d round(s); first = time to the first complete event line, total = to EOF; added = this path − its direct call in the same round, median over rounds.\n\n", rounds(byKey, "stream"))
	fmt.Fprintln(w, "| path | streams/s | first p50 | first p99 | total p50 | total p99 | added first p50 | added first p99 | added total p50 | added total p99 | success | edge CPU µs/stream (b: floor's) | node CPU µs/stream |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	fs := []func(record) float64{
		func(r record) float64 { return r.FirstP50 }, func(r record) float64 { return r.FirstP99 },
		func(r record) float64 { return r.TotalP50 }, func(r record) float64 { return r.TotalP99 },
	}
	for _, rate := range rs {
		for _, p := range paths {
			cur := byKey[key{"stream", p.id, rate}]
			if len(cur) == 0 {
				continue
			}
			bases := []string{p.base}
			if p.id == "d" {
				bases = append(bases, "a")
			}
			for i, b := range bases {
				name := p.name
				if b != "" {
					name += " vs " + b
				}
				row := fmt.Sprintf("| %s | %d |", name, rate)
				for _, f := range fs {
					row += " " + ms(med(cur, f)) + " |"
				}
				base := byKey[key{"stream", b, rate}]
				for _, f := range fs {
					if b == "" {
						row += " — |"
					} else {
						row += " " + signedMs(medDiff(cur, base, f)) + " |"
					}
				}
				if i == 0 {
					row += " " + success(cur) + " | " + cpuCol(cur, "edge") + " | " + cpuCol(cur, "node") + " |"
				} else {
					row += " | | |"
				}
				fmt.Fprintln(w, row)
			}
		}
	}
	fmt.Fprintln(w)
}

// reportSys tabulates read and write system calls per request of the
// processes on each proxied path (from /proc/<pid>/io).
func reportSys(w io.Writer, byKey map[key]map[int]record) {
	type row struct {
		k     key
		label string
	}
	var rows []row
	for _, kind := range []string{"rate", "wrk", "stream"} {
		for _, rate := range rates(byKey, kind) {
			for _, p := range []string{"b", "c", "d"} {
				k := key{kind, p, rate}
				rs := byKey[k]
				if len(rs) == 0 || med(rs, func(r record) float64 { return float64(len(r.SysPerReq)) }) == 0 {
					continue
				}
				label := map[string]string{"rate": fmt.Sprintf("open loop %d RPS", rate), "wrk": "closed loop (wrk)", "stream": fmt.Sprintf("100-chunk streams, %d/s", rate)}[kind]
				rows = append(rows, row{k, label})
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "### System calls per request")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Read-class and write-class system calls (/proc/<pid>/io syscr, syscw) per request, median over rounds. For path b the edge columns are the floor proxy's.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| load | path | edge reads | edge writes | node reads | node writes |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|")
	for _, r := range rows {
		rs := byKey[r.k]
		proc := "edge"
		if r.k.path == "b" {
			proc = "floor"
		}
		col := func(name string) string {
			return fmt.Sprintf("%.1f", med(rs, func(x record) float64 { return x.SysPerReq[name] }))
		}
		node := [2]string{"—", "—"}
		if r.k.path != "b" {
			node = [2]string{col("node_r"), col("node_w")}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", r.label, r.k.path, col(proc+"_r"), col(proc+"_w"), node[0], node[1])
	}
	fmt.Fprintln(w)
}

func reportHold(w io.Writer, holds []record) {
	if len(holds) == 0 {
		return
	}
	fmt.Fprintln(w, "### Concurrent slow streams")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Held = most streams in flight at once (headers in, EOF not yet) seen by the client; complete = ended with every expected content byte and the terminal event. RSS in MiB; \"before\" is the idle RSS of an edge and node started fresh for this run (for path a, of the processes left by the runs before); per stream = (RSS at the most in flight − RSS before) ÷ streams in flight.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| path | streams | held at once | complete | edge RSS before → in flight | edge KiB/stream | edge MiB per 1,000 | node RSS before → in flight | node KiB/stream | edge HWM after | node HWM after | failures |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, h := range holds {
		name := h.Path
		for _, p := range paths {
			if p.id == h.Path {
				name = p.name
			}
		}
		if !onPath(h.Path, "edge") { // a rig check: the product is not on the path
			fmt.Fprintf(w, "| %s | %d | %d | %d | — | — | — | — | — | — | — | %s |\n", name, h.Streams, h.Held, h.Complete, failText(h.Failures))
			continue
		}
		per := func(proc string) (string, string) {
			if h.RSS == nil || h.Held == 0 {
				return "—", "—"
			}
			d := float64(h.RSS[proc]) - float64(h.RSSBefore[proc])
			return fmt.Sprintf("%.1f", d/float64(h.Held)), fmt.Sprintf("%.1f", d/float64(h.Held)*1000/1024)
		}
		ek, em := per("edge")
		nk, _ := per("node")
		fails := failText(h.Failures)
		fmt.Fprintf(w, "| %s | %d | %d | %d | %s → %s | %s | %s | %s → %s | %s | %s | %s | %s |\n",
			name, h.Streams, h.Held, h.Complete,
			mib(h.RSSBefore["edge"]), mib(h.RSS["edge"]), ek, em,
			mib(h.RSSBefore["node"]), mib(h.RSS["node"]), nk, mib(h.HWM["edge"]), mib(h.HWM["node"]), fails)
	}
	fmt.Fprintln(w)
}

func failText(f map[string]int) string {
	if len(f) == 0 {
		return "none"
	}
	return fmt.Sprint(f)
}

func mib(kib uint64) string {
	if kib == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", float64(kib)/1024)
}

func reportMem(w io.Writer, mems []record) {
	if len(mems) == 0 {
		return
	}
	fmt.Fprintln(w, "### Process memory")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| when | edge VmRSS MiB | edge VmHWM MiB | node VmRSS MiB | node VmHWM MiB |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	for _, m := range mems {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", m.Label, mib(m.RSS["edge"]), mib(m.HWM["edge"]), mib(m.RSS["node"]), mib(m.HWM["node"]))
	}
	fmt.Fprintln(w)
}

func hasPath(byKey map[key]map[int]record, kind, path string) bool {
	for k := range byKey {
		if k.kind == kind && k.path == path {
			return true
		}
	}
	return false
}

func rounds(byKey map[key]map[int]record, kind string) int {
	n := 0
	for k, rs := range byKey {
		if k.kind == kind {
			n = max(n, len(rs))
		}
	}
	return n
}

// reportPairs tabulates the passive-health runs: N requests at
// concurrency C to a model group of two providers, with the first provider
// answering 503 or healthy; added = this row's p50 − the healthy pair's in
// the same round, median over rounds.
func reportPairs(w io.Writer, concs []record) {
	if len(concs) == 0 {
		return
	}
	by := map[string]map[int]record{}
	for _, r := range concs {
		if by[r.Path] == nil {
			by[r.Path] = map[int]record{}
		}
		by[r.Path][r.Round] = r
	}
	fmt.Fprintln(w, "### Passive health: one of two providers answers 503")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Closed loop, a fixed number of requests at a fixed concurrency; ms, median over rounds; added p50 = this path's p50 − the healthy pair's in the same round.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| path | requests × rounds | concurrency | success | p50 | p99 | added p50 vs two healthy | failures |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---|")
	p50 := func(r record) float64 { return r.P50 }
	for _, p := range pairPaths {
		rs := by[p.id]
		if len(rs) == 0 {
			continue
		}
		var n, c int
		fails := map[string]int{}
		for _, r := range rs {
			n, c = r.Requests, r.Rate
			for k, v := range r.Failures {
				fails[k] += v
			}
		}
		added := "—"
		if p.base != "" {
			added = signedMs(medDiff(rs, by[p.base], p50))
		}
		fmt.Fprintf(w, "| %s | %d × %d | %d | %s | %s | %s | %s | %s |\n", p.name, n, len(rs), c, success(rs),
			ms(med(rs, p50)), ms(med(rs, func(r record) float64 { return r.P99 })), added, failText(fails))
	}
	fmt.Fprintln(w)
}
