package managed

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	iop "iop/proto/gen/iop"
)

// The backend's models (Models rescans models_dir and the models map) and
// what it reports of them: Residency, Loaded, Report, Stats and a model's
// Log.

// Models rescans the backend's models (models_dir's *.gguf files and the
// models map; SPEC U1, D1) and returns their names, sorted. A file that
// cannot be read is left out.
func (b *Backend) Models() ([]string, error) {
	files := map[string]string{}
	var scanErr error
	if dir := b.cfg.ModelsDir; dir != "" {
		ents, err := os.ReadDir(dir)
		if err != nil {
			scanErr = fmt.Errorf("managed %q: models_dir: %w", b.cfg.Name, err)
		}
		for _, e := range ents {
			name, ok := strings.CutSuffix(e.Name(), ".gguf")
			if ok && e.Type().IsRegular() && nameOK(name) && len(files) < maxModels {
				files[name] = filepath.Join(dir, e.Name())
			}
		}
	}
	for name, f := range b.cfg.Models {
		files[name] = f
	}
	mem := map[string]int64{}
	for name, f := range files {
		st, err := os.Stat(f)
		if err != nil || !st.Mode().IsRegular() {
			delete(files, name)
			continue
		}
		mem[name] = int64(math.Ceil(float64(st.Size()) * MemoryFactor / (1 << 20)))
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	b.mu.Lock()
	b.files = files
	b.m.SetModels(mem, b.cfg.Preload)
	b.step(Event{Kind: EvTick})
	b.mu.Unlock()
	return names, scanErr
}

// maxModels bounds one scan (config.MaxManagedModels).
const maxModels = 4096

// nameOK is config.ModelNameOK (not imported: the config package is the
// node's file format).
func nameOK(name string) bool {
	if name == "" || len(name) > 200 || name[0] == '.' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':') {
			return false
		}
	}
	return true
}

// Residency is every model's state, sorted by name (SPEC U2, U3).
func (b *Backend) Residency() []Residency {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m.Residency()
}

// Loaded is model's process's base URL while it is loaded (nil
// otherwise) and its residency (State.String); "" when model is not one
// of the backend's. It never starts anything.
func (b *Backend) Loaded(model string) (*url.URL, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	md := b.m.models[model]
	if md == nil || !md.known {
		return nil, ""
	}
	if p := b.procs[model]; md.state == Loaded && p != nil {
		return &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))}, md.state.String()
	}
	return nil, md.state.String()
}

// Report is every model's residency as NodeResidencyReport carries it
// (SPEC U6), sorted by model.
func (b *Backend) Report() []*iop.ModelResidency {
	rs := b.Residency()
	out := make([]*iop.ModelResidency, 0, len(rs))
	for _, r := range rs {
		c := r.Counts
		out = append(out, &iop.ModelResidency{Model: r.Model, State: r.State.String(), LoadMs: r.LoadTime.Milliseconds(),
			MemoryMb: r.MemoryMB, InFlight: int32(min(r.InFlight, 1<<30)),
			Loads: c.Loads, LoadMsTotal: c.LoadTotal.Milliseconds(), LoadFailures: c.LoadFailures, Crashes: c.Crashes,
			Evictions: c.Evictions, IdleUnloads: c.IdleUnloads})
	}
	return out
}

// Stats are the machine's counters.
func (b *Backend) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m.Stats()
}

// Log is the last bytes of model's last process's stdout and stderr.
func (b *Backend) Log(model string) []byte {
	b.mu.Lock()
	r := b.logs[model]
	b.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.Bytes()
}
