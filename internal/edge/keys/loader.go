package keys

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/keystore"
	"iop/internal/storefile"
)

// PollInterval is how often Loader.Run looks at the key store file: a key
// revoked (or rotated, or created) is in effect within it plus the time to
// read the file (K2: within a second).
const PollInterval = 250 * time.Millisecond

// MissPollInterval bounds how often an unknown key makes the Loader look
// at the store file at once (a key `edge keys create` printed a moment
// ago works on its first request): a client sending wrong keys causes at
// most one stat(2) per interval.
const MissPollInterval = 100 * time.Millisecond

// Loader keeps a Registry's Set current from the Edge config's api_keys
// and its key store file (K2): Reload on SIGHUP, Poll whenever the file
// changed. A store that does not load (malformed, corrupted, conflicting
// with api_keys, gone, older than the one in effect) is refused and the
// Set in effect is kept; each
// refused version of the file is logged once. Safe for concurrent use;
// Run is its one goroutine.
type Loader struct {
	reg *Registry
	log *slog.Logger

	mu        sync.Mutex // serializes Reload and Poll; guards the fields below
	apiKeys   []config.APIKey
	path      string // keys.store_file; "" = none
	edgeCount int
	store     *keystore.Store
	seen      stamp // the file the store in effect was read from
	refused   stamp // the last file refused (logged once)

	lastMiss atomic.Int64 // Unix ns of the last poll an unknown key caused
	now      func() time.Time
}

// stamp identifies one version of a file (storefile.Stamp).
type stamp = storefile.Stamp

func stampOf(fi fs.FileInfo) stamp { return storefile.StampOf(fi) }

// NewLoader loads cfg's api_keys and key store (a missing store file is a
// store without keys: `edge keys create` makes it) and returns the
// Registry it keeps current. A store that does not load is an error:
// there is no previous one to keep. log may be nil.
func NewLoader(cfg *config.Config, log *slog.Logger) (*Loader, *Registry, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Loader{log: log, now: time.Now}
	set, st, seen, err := l.build(cfg.APIKeys, cfg.Keys.StoreFile, cfg.Keys.EdgeCount)
	if err != nil {
		return nil, nil, err
	}
	l.reg = New(set)
	l.reg.onMiss = l.pollOnMiss
	l.apiKeys, l.path, l.edgeCount, l.store, l.seen = cfg.APIKeys, cfg.Keys.StoreFile, cfg.Keys.EdgeCount, st, seen
	if l.path != "" {
		log.Info("key store loaded", "file", l.path, "keys", set.Len()-len(cfg.APIKeys), "revision", set.Revision())
	}
	return l, l.reg, nil
}

// Registry is the Registry the Loader keeps current.
func (l *Loader) Registry() *Registry { return l.reg }

// build reads the store at path (when set) and indexes it with apiKeys.
func (l *Loader) build(apiKeys []config.APIKey, path string, edgeCount int) (*Set, *keystore.Store, stamp, error) {
	var st *keystore.Store
	var seen stamp
	if path != "" {
		var err error
		st, seen, err = readStore(path)
		if errors.Is(err, fs.ErrNotExist) {
			st, seen, err = keystore.New(), stamp{}, nil
		}
		if err != nil {
			return nil, nil, seen, err
		}
	}
	set, err := Build(apiKeys, st, path != "", edgeCount)
	if err != nil {
		return nil, nil, seen, err
	}
	return set, st, seen, nil
}

// readStore stats and reads the store file, returning the stamp of the
// version it read (stat after the read: a write between the two is seen
// again on the next poll).
func readStore(path string) (*keystore.Store, stamp, error) {
	st, err := keystore.Load(path)
	if err != nil {
		return nil, stamp{}, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, stamp{}, fmt.Errorf("key store: %w", err)
	}
	return st, stampOf(fi), nil
}

// Reload applies a reloaded config (SIGHUP): its api_keys, keys.store_file
// and keys.edge_count, with the store file read again — an older store
// too (Poll refuses one), logged as a warning. On an error nothing
// changes and the caller rejects the reload.
func (l *Loader) Reload(cfg *config.Config) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	set, st, seen, err := l.build(cfg.APIKeys, cfg.Keys.StoreFile, cfg.Keys.EdgeCount)
	if err != nil {
		return err
	}
	if old := l.reg.Set(); cfg.Keys.StoreFile == l.path && set.Revision() < old.Revision() {
		l.log.Warn("key store revision went back: applying the older store on SIGHUP", "file", l.path,
			"revision", set.Revision(), "previous_revision", old.Revision(), "keys", set.Len()-len(cfg.APIKeys))
	}
	l.apiKeys, l.path, l.edgeCount, l.store, l.seen, l.refused = cfg.APIKeys, cfg.Keys.StoreFile, cfg.Keys.EdgeCount, st, seen, stamp{}
	l.reg.Swap(set)
	return nil
}

// Poll reads the key store again when its file changed since the version
// in effect and reports whether it swapped in a new Set. A file that does
// not load, or is gone, keeps the Set in effect (logged once per version).
func (l *Loader) Poll() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.path == "" {
		return false
	}
	var now stamp
	fi, err := os.Stat(l.path)
	if err == nil {
		now = stampOf(fi)
	}
	if now == l.seen || (now.Exists() && now == l.refused) {
		return false
	}
	if !now.Exists() { // gone since the last poll (seen holds the version in effect)
		l.log.Error("key store file is gone; keeping the keys in effect (revoke keys with `edge keys revoke`)",
			"file", l.path, "keys", l.reg.Set().Len(), "err", err)
		l.seen = stamp{} // a file written again is a change
		return false
	}
	st, seen, err := readStore(l.path)
	var set *Set
	if err == nil {
		err = l.older(st)
	}
	if err == nil {
		set, err = Build(l.apiKeys, st, true, l.edgeCount)
	}
	if err != nil {
		l.refused = now
		l.log.Error("key store refused; keeping the keys in effect", "file", l.path, "err", err)
		return false
	}
	old := l.reg.Set()
	l.store, l.seen, l.refused = st, seen, stamp{}
	l.reg.Swap(set)
	l.log.Info("key store reloaded", "file", l.path, "revision", set.Revision(), "previous_revision", old.Revision(),
		"keys", set.Len()-len(l.apiKeys))
	return true
}

// older refuses, while the Edge runs, a store whose revision is below the
// one in effect (K1): `edge keys` only ever raises it, so a lower one is an
// older copy put back or a new store begun after the file was lost, and
// applying it would drop the other keys with their spent budgets and bring
// revoked keys back. A SIGHUP (Reload) or a restart applies it on purpose.
func (l *Loader) older(st *keystore.Store) error {
	if in := l.reg.Set().Revision(); st.Revision < in {
		return fmt.Errorf("key store revision %d is older than the revision %d in effect "+
			"(an older copy put back, or a new store begun after the file was lost): "+
			"restore the newer file, or send SIGHUP or restart the edge to apply this one", st.Revision, in)
	}
	return nil
}

// pollOnMiss is the Registry's onMiss: Poll, at most once per
// MissPollInterval (a miss within it reports false at once).
func (l *Loader) pollOnMiss() bool {
	now := l.now().UnixNano()
	last := l.lastMiss.Load()
	if now-last < int64(MissPollInterval) || !l.lastMiss.CompareAndSwap(last, now) {
		return false
	}
	return l.Poll()
}

// Run polls the key store file every interval (≤ 0: PollInterval) until
// ctx is done. onSwap, when set, is called after each swap.
func (l *Loader) Run(ctx context.Context, interval time.Duration, onSwap func()) {
	if interval <= 0 {
		interval = PollInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if l.Poll() && onSwap != nil {
				onSwap()
			}
		}
	}
}
