package fleet

import (
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	iop "iop/proto/gen/iop"
)

// Bounds of what one node's reports may hold (SPEC D1): a node can lie or
// be compromised, so its lists cost the edge a bounded amount.
const (
	MaxReportAdapters = 64      // adapters per report
	MaxAdapterModels  = 4096    // models per adapter
	MaxModelName      = 256     // bytes per model name
	MaxReportBytes    = 1 << 20 // bytes of names per node, all adapters
)

// discovery is one node's reported models, for one generation; or, with
// fenced set, the mark that generation gen was fenced (adapters nil): no
// report of gen or older is taken after it (SPEC D2, L8).
type discovery struct {
	gen      uint64
	adapters map[string][]string // never mutated once installed
	fenced   bool
}

// Report takes a NodeModelsReport of generation gen of node (SPEC D1,
// D2), from its session's read loop: only the adapters the config asks
// the node to discover are kept (config.Discovers: a model_discovery rule
// or a target glob names them; whatever else a node reports is dropped,
// so it costs neither memory nor /status bytes), the lists are cleaned
// (names that are empty, longer than MaxModelName, not UTF-8 or with
// control characters are dropped; the rest sorted, deduplicated and cut
// to the bounds above), an adapter reporting an error keeps the list it
// had, and Changed is called when anything differs. A report of an older
// generation than the one held, or of a generation NodeFenced already
// fenced, is ignored: the check and the store are one step under f.mu, so
// a report its session's read loop passed as current just before a
// takeover fenced it is dropped whichever of the two runs first. The "node models" line a
// change logs is rate limited (a node may report as often as it likes).
// It reports whether the models changed.
func (f *Fleet) Report(node string, gen uint64, r *iop.NodeModelsReport) bool {
	f.mu.Lock()
	old := f.disc[node]
	if old != nil && (gen < old.gen || old.fenced && gen == old.gen) {
		f.mu.Unlock()
		return false
	}
	next := map[string][]string{}
	if old != nil && old.gen == gen {
		for a, ms := range old.adapters {
			next[a] = ms
		}
	}
	budget := MaxReportBytes
	for i, am := range r.GetAdapters() {
		if i >= MaxReportAdapters {
			break
		}
		name := am.GetAdapter()
		if !nameRE.MatchString(name) || f.cfg == nil || !f.cfg.Discovers(node, name) {
			continue
		}
		if am.GetError() != "" {
			if _, had := next[name]; !had {
				next[name] = nil
			}
			continue
		}
		next[name] = cleanModels(am.GetModels(), &budget)
	}
	changed := old == nil || !sameModels(old.adapters, next)
	f.disc[node] = &discovery{gen: gen, adapters: next}
	f.mu.Unlock()
	if changed {
		if ok, suppressed := f.modelsLog.Allow(f.o.Now()); ok {
			f.log.Info("node models", "node", node, "generation", gen, "models", countModels(next), "suppressed", suppressed)
		}
		f.o.Changed()
	}
	return changed
}

// NodeFenced forgets what generation gen (or an earlier one) of node
// reported: a discovered model exists while a node serving it is
// connected (SPEC D2). It leaves the mark that gen is fenced, so that a
// report of gen that comes after it is not kept (see Report): one small
// entry per node name that was ever ready, replaced by its next
// generation's report.
func (f *Fleet) NodeFenced(node string, gen uint64) {
	f.mu.Lock()
	d := f.disc[node]
	drop := d == nil || d.gen <= gen
	if drop {
		f.disc[node] = &discovery{gen: gen, fenced: true}
	}
	f.mu.Unlock()
	if drop && d != nil && countModels(d.adapters) > 0 {
		f.o.Changed()
	}
}

// Discovered returns, per node and adapter, the models reported now (for
// /status); the maps must not be changed.
func (f *Fleet) Discovered() map[string]map[string][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]map[string][]string, len(f.disc))
	for n, d := range f.disc {
		if !d.fenced {
			out[n] = d.adapters
		}
	}
	return out
}

func cleanModels(in []string, budget *int) []string {
	out := make([]string, 0, min(len(in), MaxAdapterModels))
	for _, m := range in {
		if m == "" || len(m) > MaxModelName || !utf8.ValidString(m) || strings.ContainsFunc(m, isControl) {
			continue
		}
		out = append(out, m)
	}
	sort.Strings(out)
	out = slices.Compact(out)
	n := 0
	for n < len(out) && n < MaxAdapterModels && *budget >= len(out[n]) {
		*budget -= len(out[n])
		n++
	}
	return slices.Clip(out[:n])
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

func sameModels(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !slices.Equal(v, w) {
			return false
		}
	}
	return true
}

func countModels(m map[string][]string) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}
