// Package keyscmd implements the "edge keys" subcommands, which manage the
// client API keys of the key store (docs/keys.md K1–K9): create prints a
// new key once, list and show describe keys, revoke and rotate change
// them, usage prints what the Edge counted. Every subcommand takes
// -config EDGE_CONFIG and finds the store (keys.store_file) and the usage
// file (keys.usage_file) from it.
//
// It owns flag parsing and reporting only; the file formats live in
// internal/edge/keystore. Writers hold the store's lock from reading to
// renaming, so concurrent commands lose nothing (K1). It never prints a
// key except the one create or rotate just made, never a hash, and never
// calls os.Exit: Main returns the exit code.
package keyscmd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/keystore"
)

// Exit codes returned by Main.
const (
	ExitOK    = 0
	ExitError = 1 // I/O error, bad config or store, no such key
	ExitUsage = 2 // bad subcommand, flag or value
)

const usage = `usage:
  edge keys create -config EDGE_CONFIG -name NAME [-models 'tiny,qwen3*'] [-rpm N] [-tpm N]
                   [-tokens-per-day N] [-max-concurrent N] [-expires 30d|12h|2026-12-31]
                   [-weight N] [-class C] [-max-class C] [-local-only]
  edge keys list   -config EDGE_CONFIG
  edge keys show   -config EDGE_CONFIG -name NAME
  edge keys revoke -config EDGE_CONFIG -name NAME
  edge keys rotate -config EDGE_CONFIG -name NAME [-grace 10m] [-weight N] [-class C] [-max-class C]
  edge keys usage  -config EDGE_CONFIG [-name NAME]
create and rotate print the new key on standard output, once; the store keeps only its hash.
A running edge picks up every change within a second (no SIGHUP needed).
Limits: 0 = no bound; -tpm and -tokens-per-day count prompt + completion tokens.
Queue: -weight is the key's fair share (1-1000, default 1); -class its requests' default
class and -max-class the highest one a request may ask for (critical, interactive, batch;
defaults interactive and -class). rotate changes only the ones given.
Data: -local-only keeps the key's requests off every adapter whose location is remote
(a hosted API), in its own group and through a fallback.
`

// Main runs "edge keys <subcommand> flags..."; args are the words after
// "keys". now stamps created_at, revoked_at and expiry.
func Main(args []string, stdout, stderr io.Writer, now func() time.Time) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "edge keys: missing subcommand\n"+usage)
		return ExitUsage
	}
	c := &cmd{name: args[0], stdout: stdout, stderr: stderr, now: now}
	switch args[0] {
	case "create":
		return c.create(args[1:])
	case "list":
		return c.list(args[1:])
	case "show":
		return c.show(args[1:])
	case "revoke":
		return c.revoke(args[1:])
	case "rotate":
		return c.rotate(args[1:])
	case "usage":
		return c.usage(args[1:])
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	}
	fmt.Fprintf(stderr, "edge keys: unknown subcommand %q\n%s", args[0], usage)
	return ExitUsage
}

type cmd struct {
	name           string
	stdout, stderr io.Writer
	now            func() time.Time
	fs             *flag.FlagSet
	configPath     *string
	cfg            *config.Config
}

// flags starts the subcommand's flag set with -config.
func (c *cmd) flags() *flag.FlagSet {
	c.fs = flag.NewFlagSet("edge keys "+c.name, flag.ContinueOnError)
	c.fs.SetOutput(c.stderr)
	c.fs.Usage = func() { fmt.Fprint(c.stderr, usage) }
	c.configPath = c.fs.String("config", "", "the edge config file (its keys.store_file is the key store)")
	return c.fs
}

// parse parses args and loads the config; done reports whether the
// caller should return code at once. required names flags that must be
// set (besides -config).
func (c *cmd) parse(args []string, required ...string) (code int, done bool) {
	if err := c.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK, true
		}
		return ExitUsage, true // the flag package named the flag
	}
	if c.fs.NArg() > 0 {
		return c.usageError(fmt.Sprintf("unexpected argument %q (every value is a flag: -name NAME)", c.fs.Arg(0)))
	}
	if *c.configPath == "" {
		return c.usageError("missing -config EDGE_CONFIG")
	}
	for _, r := range required {
		if f := c.fs.Lookup(r); f != nil && f.Value.String() == "" {
			return c.usageError("missing -" + r)
		}
	}
	cfg, err := config.Load(*c.configPath)
	if err != nil {
		return c.fail(err), true
	}
	if cfg.Keys.StoreFile == "" {
		return c.fail(fmt.Errorf(`%s has no keys.store_file: add "keys": {"store_file": "keys.json"} to it (a path relative to the config)`, *c.configPath)), true
	}
	c.cfg = cfg
	return 0, false
}

func (c *cmd) usageError(msg string) (int, bool) {
	fmt.Fprintf(c.stderr, "edge keys %s: %s\n%s", c.name, msg, usage)
	return ExitUsage, true
}

func (c *cmd) fail(err error) int {
	fmt.Fprintf(c.stderr, "edge keys %s: %v\n", c.name, err)
	return ExitError
}

// edit runs change on the store under its lock and saves it (K1).
func (c *cmd) edit(change func(*keystore.Store) error) error {
	return keystore.Update(c.cfg.Keys.StoreFile, change)
}

// limitFlags are the four bound flags, in keystore.Limits.Check's order.
var limitFlags = [4]string{"-rpm", "-tpm", "-tokens-per-day", "-max-concurrent"}

func (c *cmd) create(args []string) int {
	fs := c.flags()
	name := fs.String("name", "", "the key's name (its principal; 1-63 of letters, digits, '.', '_', '-')")
	models := fs.String("models", "", "comma-separated model groups and patterns ('*' any run, '?' one character); empty = every model")
	rpm := fs.Int64("rpm", 0, "requests per minute")
	tpm := fs.Int64("tpm", 0, "tokens per minute (prompt + completion)")
	tpd := fs.Int64("tokens-per-day", 0, "tokens per UTC day (prompt + completion)")
	conc := fs.Int64("max-concurrent", 0, "requests in flight")
	expires := fs.String("expires", "", "expiry: 30d, 12h, 90m, 2026-12-31 or an RFC 3339 time; empty = never")
	sched := schedFlags(fs)
	localOnly := fs.Bool("local-only", false, "never route the key's requests to a remote adapter (SPEC V3)")
	if code, done := c.parse(args, "name"); done {
		return code
	}
	now := c.now()
	spec := keystore.Spec{Name: *name, Limits: keystore.Limits{RequestsPerMinute: *rpm, TokensPerMinute: *tpm, TokensPerDay: *tpd, MaxConcurrent: *conc},
		Sched: sched.value(), LocalOnly: *localOnly}
	if err := spec.Limits.Check(limitFlags); err != nil {
		code, _ := c.usageError(err.Error())
		return code
	}
	if err := spec.Sched.Check(schedFlagNames); err != nil {
		code, _ := c.usageError(err.Error())
		return code
	}
	var err error
	if spec.Models, err = keystore.ParseModels(*models); err != nil {
		code, _ := c.usageError("-models: " + err.Error())
		return code
	}
	if *expires != "" {
		if spec.ExpiresAt, err = keystore.ParseExpiry(*expires, now); err != nil {
			code, _ := c.usageError(err.Error())
			return code
		}
	}
	if !keystore.ValidName(*name) {
		code, _ := c.usageError(fmt.Sprintf("-name %q: 1-63 of letters, digits, '.', '_', '-', starting with a letter or digit", *name))
		return code
	}
	for _, k := range c.cfg.APIKeys {
		if k.Principal == *name {
			return c.fail(fmt.Errorf("-name %q is an api_keys principal of %s; pick another name", *name, *c.configPath))
		}
	}
	var secret string
	fresh := false
	if err := c.edit(func(st *keystore.Store) (err error) {
		fresh = st.Revision == 0
		secret, err = st.Create(spec, now)
		return err
	}); err != nil {
		return c.fail(err)
	}
	fmt.Fprintln(c.stdout, secret)
	fmt.Fprintf(c.stderr, "key %q created (%s, %s, %s); the line above is the key, shown only this once\n", *name,
		describe(spec.Models, spec.Limits, spec.ExpiresAt), describeSched(spec.Sched), describeData(spec.LocalOnly))
	if fresh {
		c.noteLostStore()
	}
	c.noteUnmatched(spec.Models)
	return ExitOK
}

// noteLostStore warns, after a create began a new store file, when the
// edge's usage file counts keys that are not api_keys principals: the
// store they were in is gone, and a running edge refuses the new one as
// older than its own (K1) until SIGHUP or a restart.
func (c *cmd) noteLostStore() {
	u, err := keystore.LoadUsage(c.cfg.Keys.UsageFile)
	if err != nil {
		return
	}
	api := map[string]bool{}
	for _, k := range c.cfg.APIKeys {
		api[k.Principal] = true
	}
	n := 0
	for _, k := range u.Keys {
		if !api[k.Name] {
			n++
		}
	}
	if n > 0 {
		fmt.Fprintf(c.stderr, "warning: %s did not exist: this began a new key store, but %s counts %d keys of an earlier one; "+
			"a running edge keeps those and refuses this store until SIGHUP or a restart (restore the old file instead if it was lost)\n",
			c.cfg.Keys.StoreFile, c.cfg.Keys.UsageFile, n)
	}
}

// noteUnmatched says which scope entries match no model group of the
// config (not an error: the group may be added later).
func (c *cmd) noteUnmatched(models []string) {
	for _, m := range models {
		hit := false
		for _, g := range c.cfg.Models {
			if keystore.Match(m, g.Name) {
				hit = true
				break
			}
		}
		if !hit {
			fmt.Fprintf(c.stderr, "note: -models entry %q matches no model group of %s (yet)\n", m, *c.configPath)
		}
	}
}

func describe(models []string, l keystore.Limits, expires time.Time) string {
	var parts []string
	if len(models) == 0 {
		parts = append(parts, "every model")
	} else {
		parts = append(parts, "models "+strings.Join(models, ","))
	}
	for _, b := range []struct {
		v    int64
		unit string
	}{{l.RequestsPerMinute, "requests/min"}, {l.TokensPerMinute, "tokens/min"}, {l.TokensPerDay, "tokens/day"}, {l.MaxConcurrent, "in flight"}} {
		if b.v > 0 {
			parts = append(parts, strconv.FormatInt(b.v, 10)+" "+b.unit)
		}
	}
	if expires.IsZero() {
		parts = append(parts, "never expires")
	} else {
		parts = append(parts, "expires "+expires.UTC().Format(time.RFC3339))
	}
	return strings.Join(parts, ", ")
}

func (c *cmd) load() (*keystore.Store, error) {
	st, err := keystore.Load(c.cfg.Keys.StoreFile)
	if errors.Is(err, fs.ErrNotExist) {
		return keystore.New(), nil
	}
	return st, err
}

func (c *cmd) list(args []string) int {
	c.flags()
	if code, done := c.parse(args); done {
		return code
	}
	st, err := c.load()
	if err != nil {
		return c.fail(err)
	}
	if st.Len() == 0 {
		fmt.Fprintf(c.stdout, "no keys in %s (edge keys create -config %s -name NAME)\n", c.cfg.Keys.StoreFile, *c.configPath)
		return ExitOK
	}
	now := c.now()
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tKEY\tMODELS\tRPM\tTPM\tTOKENS/DAY\tIN FLIGHT\tEXPIRES")
	for _, k := range st.Keys() {
		models := "*"
		if len(k.Models) > 0 {
			models = scopeColumn(k.Models)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.Name, k.Status(now), k.Hint, models,
			bound(k.RequestsPerMinute), bound(k.TokensPerMinute), bound(k.TokensPerDay), bound(k.MaxConcurrent), date(k.ExpiresAt))
	}
	return flushErr(c, tw.Flush())
}

// listScopeWidth bounds the MODELS column of `list` (tabwriter pads every
// row to the widest cell); `show` prints a scope whole.
const listScopeWidth = 40

// scopeColumn is models joined by commas, cut after the entries that fit
// listScopeWidth with the count of the rest: "m-0,m-1,… (+98)".
func scopeColumn(models []string) string {
	all := strings.Join(models, ",")
	if len(all) <= listScopeWidth {
		return all
	}
	n, width := 0, 0
	for n < len(models) && (n == 0 || width+1+len(models[n]) <= listScopeWidth) {
		width += len(models[n]) + min(n, 1)
		n++
	}
	return strings.Join(models[:n], ",") + ",… (+" + strconv.Itoa(len(models)-n) + ")"
}

func bound(v int64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatInt(v, 10)
}

func date(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

func flushErr(c *cmd, err error) int {
	if err != nil {
		return c.fail(err)
	}
	return ExitOK
}

func (c *cmd) show(args []string) int {
	name := c.flags().String("name", "", "the key's name")
	if code, done := c.parse(args, "name"); done {
		return code
	}
	st, err := c.load()
	if err != nil {
		return c.fail(err)
	}
	k, ok := st.Key(*name)
	if !ok {
		return c.fail(fmt.Errorf("%w %q in %s", keystore.ErrNoKey, *name, c.cfg.Keys.StoreFile))
	}
	now := c.now()
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "name:\t%s\nstatus:\t%s\nkey:\t%s\nmodels:\t%s\n", k.Name, k.Status(now), k.Hint, modelsOf(k.Models))
	fmt.Fprintf(tw, "requests per minute:\t%s\ntokens per minute:\t%s\ntokens per day:\t%s\nmax concurrent:\t%s\n",
		bound(k.RequestsPerMinute), bound(k.TokensPerMinute), bound(k.TokensPerDay), bound(k.MaxConcurrent))
	fmt.Fprintf(tw, "queue:\t%s\n", describeSched(k.Sched()))
	fmt.Fprintf(tw, "data:\t%s\n", describeData(k.LocalOnly))
	if n := c.cfg.Keys.EdgeCount; n > 1 {
		fmt.Fprintf(tw, "edges:\t%d (each enforces every bound ÷ %d, rounded up)\n", n, n)
	}
	fmt.Fprintf(tw, "created:\t%s\nexpires:\t%s\n", date(k.CreatedAt), date(k.ExpiresAt))
	if !k.RevokedAt.IsZero() {
		fmt.Fprintf(tw, "revoked:\t%s\n", date(k.RevokedAt))
	}
	if k.PreviousKeySHA256 != "" && now.Before(k.PreviousExpiresAt) {
		fmt.Fprintf(tw, "previous key valid until:\t%s\n", date(k.PreviousExpiresAt))
	}
	if u, err := keystore.LoadUsage(c.cfg.Keys.UsageFile); err == nil {
		for _, ku := range u.Keys {
			if ku.Name == k.Name {
				fmt.Fprintf(tw, "requests:\t%d (refused %d)\ntokens:\t%d prompt, %d completion, %d estimated\ntokens today:\t%d\nusage as of:\t%s\n",
					ku.Requests, ku.Refused, ku.PromptTokens, ku.CompletionTokens, ku.EstimatedTokens, todayTokens(ku, now), date(u.SavedAt))
			}
		}
	}
	return flushErr(c, tw.Flush())
}

func modelsOf(m []string) string {
	if len(m) == 0 {
		return "every model"
	}
	return strings.Join(m, ", ")
}

// todayTokens is ku's tokens of now's UTC day.
func todayTokens(ku keystore.KeyUsage, now time.Time) int64 {
	if ku.Day == now.UTC().Format(time.DateOnly) {
		return ku.DayTokens
	}
	return 0
}

func (c *cmd) revoke(args []string) int {
	name := c.flags().String("name", "", "the key's name")
	if code, done := c.parse(args, "name"); done {
		return code
	}
	if err := c.edit(func(st *keystore.Store) error { return st.Revoke(*name, c.now()) }); err != nil {
		return c.fail(err)
	}
	fmt.Fprintf(c.stdout, "key %q revoked; a running edge refuses it within a second (requests in flight finish)\n", *name)
	return ExitOK
}

func (c *cmd) rotate(args []string) int {
	fs := c.flags()
	name := fs.String("name", "", "the key's name")
	grace := fs.Duration("grace", 0, "how long the replaced key stays valid (0 = refused at once; at most 720h)")
	sched := schedFlags(fs)
	if code, done := c.parse(args, "name"); done {
		return code
	}
	if *grace < 0 || *grace > keystore.MaxGrace {
		code, _ := c.usageError(fmt.Sprintf("-grace %v: must be between 0 and %v", *grace, keystore.MaxGrace))
		return code
	}
	var secret string
	var now keystore.Sched
	if err := c.edit(func(st *keystore.Store) (err error) {
		if secret, err = st.Rotate(*name, *grace, c.now()); err != nil {
			return err
		}
		k, _ := st.Key(*name)
		now = sched.over(fs, k.Sched())
		if err := now.Check(schedFlagNames); err != nil {
			return err
		}
		return st.SetSched(*name, now)
	}); err != nil {
		return c.fail(err)
	}
	fmt.Fprintln(c.stdout, secret)
	how := "the replaced key is refused at once"
	if *grace > 0 {
		how = "the replaced key stays valid for " + grace.String()
	}
	fmt.Fprintf(c.stderr, "key %q rotated: the line above is its new key, shown only this once; %s; %s\n", *name, how, describeSched(now))
	return ExitOK
}

func (c *cmd) usage(args []string) int {
	name := c.flags().String("name", "", "only this key")
	if code, done := c.parse(args); done {
		return code
	}
	path := c.cfg.Keys.UsageFile
	u, err := keystore.LoadUsage(path)
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(c.stdout, "no usage recorded yet in %s (a running edge writes it every %v while it counts)\n", path, c.cfg.Keys.UsageFlush())
		return ExitOK
	}
	if err != nil {
		return c.fail(err)
	}
	st, err := c.load()
	if err != nil {
		return c.fail(err)
	}
	limits := map[string]keystore.Limits{}
	for _, k := range st.Keys() {
		limits[k.Name] = k.Limits()
	}
	now := c.now()
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tREQUESTS\tREFUSED\tPROMPT\tCOMPLETION\tESTIMATED\tTODAY\tTOKENS/DAY")
	found := false
	for _, ku := range u.Keys {
		if *name != "" && ku.Name != *name {
			continue
		}
		found = true
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", ku.Name, ku.Requests, ku.Refused, ku.PromptTokens, ku.CompletionTokens,
			ku.EstimatedTokens, todayTokens(ku, now), bound(limits[ku.Name].TokensPerDay))
	}
	if err := tw.Flush(); err != nil {
		return c.fail(err)
	}
	if *name != "" && !found {
		fmt.Fprintf(c.stdout, "no usage of %q recorded\n", *name)
	}
	fmt.Fprintf(c.stdout, "as of %s: this edge's counts (%s); with keys.edge_count %d, each edge counts its own\n",
		date(u.SavedAt), path, c.cfg.Keys.EdgeCount)
	return ExitOK
}

// schedFlagNames are the queue flags, in keystore.Sched.Check's order.
var schedFlagNames = [3]string{"-weight", "-class", "-max-class"}

// sched holds the queue flags of create and rotate (SPEC G1, G4).
type sched struct {
	weight          *int
	class, maxClass *string
}

func schedFlags(fs *flag.FlagSet) sched {
	return sched{
		weight:   fs.Int("weight", 0, "the key's fair-share weight in the queue, 1-1000 (0 = 1)"),
		class:    fs.String("class", "", "its requests' default class: critical, interactive or batch (empty = interactive)"),
		maxClass: fs.String("max-class", "", "the highest class a request of the key may ask for (empty = -class)"),
	}
}

func (s sched) value() keystore.Sched {
	return keystore.Sched{Weight: *s.weight, Class: *s.class, MaxClass: *s.maxClass}
}

// over is old with the flags given on the command line in its place.
func (s sched) over(fs *flag.FlagSet, old keystore.Sched) keystore.Sched {
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "weight":
			old.Weight = *s.weight
		case "class":
			old.Class = *s.class
		case "max-class":
			old.MaxClass = *s.maxClass
		}
	})
	return old
}

// describeData says where a key's requests may go (SPEC V3).
func describeData(localOnly bool) string {
	if localOnly {
		return "local adapters only"
	}
	return "local and remote adapters"
}

// describeSched says a key's place in the queue, defaults filled in.
func describeSched(s keystore.Sched) string {
	e := s.Effective()
	return fmt.Sprintf("weight %d, class %s, max class %s", e.Weight, e.Class, e.MaxClass)
}
