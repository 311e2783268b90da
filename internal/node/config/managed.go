package config

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"iop/internal/jsonconfig"
)

// Managed-backend defaults and bounds (SPEC U1-U5; docs/config.md, "Node
// config", managed[]).
const (
	DefaultManagedHealthPath     = "/health"
	DefaultManagedReadyTimeoutMs = 120000
	MaxManagedReadyTimeoutMs     = 3600000
	DefaultManagedIdleUnloadMs   = 600000
	MaxManagedIdleUnloadMs       = 7 * 24 * 3600000
	DefaultManagedMaxLoaded      = 1
	MaxManagedMaxLoaded          = 64
	// MaxManaged bounds managed[]; MaxManagedArgs a command's length.
	MaxManaged     = 16
	MaxManagedArgs = 256
	// MaxManagedModels bounds models{} (and what one models_dir scan
	// takes: internal/node/managed).
	MaxManagedModels = 4096
)

// Managed is one managed backend (managed[]): a program this node starts
// per model on demand, one process per loaded model (SPEC U1). It is read
// from the node's own config file only; the Edge can name a managed
// backend (AdapterConfig.managed) but never say what it runs.
type Managed struct {
	// Name is what an adapter's managed key names.
	Name string `json:"name"`
	// Command is the program and its arguments, run without a shell:
	// command[0] is a path (or a name looked up in PATH at load); in every
	// element "{model}" becomes the model file's path, "{name}" the model's
	// name and "{port}" the port the process must listen on (127.0.0.1).
	// "{port}" must appear.
	Command []string `json:"command"`
	// ModelsDir: every regular file in it whose name ends in ".gguf" is a
	// model named after the file without the suffix, rescanned at every
	// discovery poll (SPEC U1, D1). Models lists them by hand instead
	// (name → file path). Set one or both; a models entry wins over a file
	// of the same name.
	ModelsDir string            `json:"models_dir"`
	Models    map[string]string `json:"models"`
	// HealthPath is polled on the process (GET, 200 = ready) until
	// ReadyTimeoutMs; omitted = "/health" (llama-server's).
	HealthPath     string `json:"health_path"`
	ReadyTimeoutMs int64  `json:"ready_timeout_ms"`
	// IdleUnloadMs: a loaded model without a request for this long is
	// stopped; omitted = 600000; 0 is not allowed (use preload to keep one
	// loaded).
	IdleUnloadMs int64 `json:"idle_unload_ms"`
	// MaxLoaded bounds the processes running at once; omitted = 1.
	MaxLoaded int `json:"max_loaded"`
	// MemoryBudgetMB bounds the sum of the loaded models' memory (file
	// size × managed.MemoryFactor, MiB); 0 = no memory bound.
	MemoryBudgetMB int64 `json:"memory_budget_mb"`
	// Preload names models loaded at node start and never unloaded for
	// idleness.
	Preload []string `json:"preload"`
	// PortRange is [first, last], the ports the processes listen on (one
	// each); required.
	PortRange []int `json:"port_range"`
	// Env is added to the environment of every process (e.g.
	// CUDA_VISIBLE_DEVICES); the process inherits only PATH, HOME, the
	// locale, TMPDIR and the GPU runtimes' variables of the node's own.
	Env map[string]string `json:"env"`
}

// applyManagedDefaults fills the omitted keys of every managed[] entry.
func (c *Config) applyManagedDefaults() {
	for i := range c.Managed {
		m := &c.Managed[i]
		if m.HealthPath == "" {
			m.HealthPath = DefaultManagedHealthPath
		}
		if m.ReadyTimeoutMs == 0 {
			m.ReadyTimeoutMs = DefaultManagedReadyTimeoutMs
		}
		if m.IdleUnloadMs == 0 {
			m.IdleUnloadMs = DefaultManagedIdleUnloadMs
		}
		if m.MaxLoaded == 0 {
			m.MaxLoaded = DefaultManagedMaxLoaded
		}
	}
}

// validateManaged checks managed[], each problem naming its key path.
func (c *Config) validateManaged() jsonconfig.Errors {
	var errs jsonconfig.Errors
	if len(c.Managed) > MaxManaged {
		return append(errs, fmt.Sprintf("managed: at most %d entries, got %d", MaxManaged, len(c.Managed)))
	}
	seen := map[string]int{}
	for i := range c.Managed {
		m := &c.Managed[i]
		p := fmt.Sprintf("managed[%d]", i)
		add := func(key, format string, args ...any) {
			errs = append(errs, p+key+": "+fmt.Sprintf(format, args...))
		}
		if !nameRE.MatchString(m.Name) {
			add(".name", "invalid name %q (1-63 of letters, digits, '.', '_', '-')", m.Name)
		} else if j, dup := seen[m.Name]; dup {
			add(".name", "%q is managed[%d].name too", m.Name, j)
		} else {
			seen[m.Name] = i
		}
		switch {
		case len(m.Command) == 0:
			add(".command", "required: the program and its arguments, e.g. [\"llama-server\", \"-m\", \"{model}\", \"--port\", \"{port}\"]")
		case len(m.Command) > MaxManagedArgs:
			add(".command", "at most %d elements, got %d", MaxManagedArgs, len(m.Command))
		default:
			port := false
			for j, a := range m.Command {
				if strings.ContainsRune(a, 0) {
					add(fmt.Sprintf(".command[%d]", j), "contains a NUL byte")
				}
				port = port || strings.Contains(a, "{port}")
			}
			if !port {
				add(".command", "no element contains {port} (the process must listen on the port the node gives it)")
			}
			if m.Command[0] == "" || strings.Contains(m.Command[0], "{") {
				add(".command[0]", "want the program's path or name, got %q", m.Command[0])
			}
		}
		if m.ModelsDir == "" && len(m.Models) == 0 {
			add("", "set models_dir or models (the model files this backend may load)")
		}
		if len(m.Models) > MaxManagedModels {
			add(".models", "at most %d models, got %d", MaxManagedModels, len(m.Models))
		}
		for name, path := range m.Models {
			if !ModelNameOK(name) {
				add(".models", "invalid model name %q (1-200 of letters, digits, '.', '_', '-', ':')", name)
			}
			if path == "" {
				add(".models."+name, "empty path")
			}
		}
		for k, v := range m.Env {
			if !envNameRE.MatchString(k) || strings.ContainsRune(v, 0) {
				add(".env", "invalid variable %q (a name of letters, digits and '_', a value without NUL)", k)
			}
		}
		if !strings.HasPrefix(m.HealthPath, "/") || strings.ContainsAny(m.HealthPath, "?#\r\n ") {
			add(".health_path", "want an absolute path without a query, got %q", m.HealthPath)
		}
		if v := m.ReadyTimeoutMs; v < 1 || v > MaxManagedReadyTimeoutMs {
			add(".ready_timeout_ms", "must be between 1 and %d, got %d", MaxManagedReadyTimeoutMs, v)
		}
		if v := m.IdleUnloadMs; v < 1 || v > MaxManagedIdleUnloadMs {
			add(".idle_unload_ms", "must be between 1 and %d, got %d", MaxManagedIdleUnloadMs, v)
		}
		if v := m.MaxLoaded; v < 1 || v > MaxManagedMaxLoaded {
			add(".max_loaded", "must be between 1 and %d, got %d", MaxManagedMaxLoaded, v)
		}
		if m.MemoryBudgetMB < 0 {
			add(".memory_budget_mb", "must be ≥ 0 (0 = no memory bound), got %d", m.MemoryBudgetMB)
		}
		if len(m.PortRange) != 2 {
			add(".port_range", "want [first, last], got %d numbers", len(m.PortRange))
		} else if lo, hi := m.PortRange[0], m.PortRange[1]; lo < 1024 || hi > 65535 || lo > hi {
			add(".port_range", "want [first, last] with 1024 ≤ first ≤ last ≤ 65535, got [%d, %d]", lo, hi)
		} else if hi-lo+1 < m.MaxLoaded {
			add(".port_range", "holds %d ports, fewer than max_loaded (%d)", hi-lo+1, m.MaxLoaded)
		}
		if len(m.Preload) > m.MaxLoaded && m.MaxLoaded > 0 {
			add(".preload", "%d models, more than max_loaded (%d)", len(m.Preload), m.MaxLoaded)
		}
		for j, name := range m.Preload {
			if !ModelNameOK(name) {
				add(fmt.Sprintf(".preload[%d]", j), "invalid model name %q", name)
			}
		}
	}
	for i, r := range c.Managed { // port ranges must not overlap: each process gets a port of its own
		for j := 0; j < i; j++ {
			o := c.Managed[j]
			if len(r.PortRange) == 2 && len(o.PortRange) == 2 && r.PortRange[0] <= o.PortRange[1] && o.PortRange[0] <= r.PortRange[1] {
				errs = append(errs, fmt.Sprintf("managed[%d].port_range: overlaps managed[%d].port_range", i, j))
			}
		}
	}
	return errs
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ModelNameOK reports whether name may name a managed model: 1-200 of
// letters, digits, '.', '_', '-' and ':', not starting with '.' (no path
// separator, so a target can never name a file outside the backend's
// models; SPEC U1).
func ModelNameOK(name string) bool {
	if name == "" || len(name) > 200 || name[0] == '.' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':' {
			continue
		}
		return false
	}
	return true
}

// resolveManaged makes managed[]'s relative paths relative to dir (the
// config file's directory) and resolves command[0] (a path relative to dir
// when it contains '/', else looked up in PATH); it reports a program that
// is not there or not executable.
func (c *Config) resolveManaged(dir string) jsonconfig.Errors {
	var errs jsonconfig.Errors
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	for i := range c.Managed {
		m := &c.Managed[i]
		m.ModelsDir = abs(m.ModelsDir)
		for k, v := range m.Models {
			m.Models[k] = abs(v)
		}
		prog := m.Command[0]
		if strings.Contains(prog, "/") {
			prog = abs(prog)
		}
		path, err := exec.LookPath(prog)
		if err != nil {
			errs = append(errs, fmt.Sprintf("managed[%d].command[0]: %v", i, err))
			continue
		}
		m.Command[0] = path
		if m.ModelsDir != "" {
			if st, err := os.Stat(m.ModelsDir); err != nil || !st.IsDir() {
				errs = append(errs, fmt.Sprintf("managed[%d].models_dir: %q is not a readable directory", i, m.ModelsDir))
			}
		}
	}
	return errs
}
