package fleet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"time"

	"iop/internal/storefile"
)

// Store is the enrollment store file (enrollment.store_file): the join
// tokens, their secrets only as SHA-256, and a record per node that joined
// or was revoked. It holds no private key and no secret. Mode 0600, written
// by storefile.WriteAtomic (rename), rewritten under its lock (Update), read
// without.
//
//	{"version": 1,
//	 "tokens": [{"id": "3f9c…", "secret_sha256": "…", "node": "gpu-3" | "prefix": "gpu-",
//	             "created_at": "…", "expires_at": "…", "uses": 1, "used": 0,
//	             "joined": ["gpu-3"], "revoked_at": "…"}],
//	 "nodes":  [{"name": "gpu-3", "lease_recipient_public_key": "<base64>",
//	             "serials": ["<hex>", "<hex>"], "not_after": "…", "enrolled_at": "…",
//	             "renewed_at": "…", "token": "3f9c…", "revoked_at": "…"}]}
//
// A Store value is not safe for concurrent use; the Fleet keeps its own
// read-only snapshot.
type Store struct {
	Version int           `json:"version"`
	Tokens  []*Token      `json:"tokens"`
	Nodes   []*NodeRecord `json:"nodes"`
}

// Token is one join token (SPEC J1).
type Token struct {
	ID           string `json:"id"`
	SecretSHA256 string `json:"secret_sha256"`
	// Node, when set, is the only name the token allows; Prefix, when
	// set, allows the names starting with it. One of the two is set.
	Node      string     `json:"node,omitempty"`
	Prefix    string     `json:"prefix,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	Uses      int        `json:"uses"`
	Used      int        `json:"used"`
	Joined    []string   `json:"joined,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// NodeRecord is a node that joined (or a name that was revoked).
type NodeRecord struct {
	Name                    string `json:"name"`
	LeaseRecipientPublicKey string `json:"lease_recipient_public_key,omitempty"`
	// Serials of the certificates issued to the node that it may still
	// present, newest first: the current one and the one it renewed
	// (hex). A certificate of any other serial is refused (SPEC J6).
	Serials    []string   `json:"serials"`
	NotAfter   time.Time  `json:"not_after"`
	EnrolledAt time.Time  `json:"enrolled_at"`
	RenewedAt  *time.Time `json:"renewed_at,omitempty"`
	Token      string     `json:"token,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
}

// ErrBadStore: the store file is not a store.
var ErrBadStore = errors.New("fleet: invalid enrollment store")

// keptSerials is how many certificate serials a record keeps: the new
// one and the one it replaced (the node may still be connected with it,
// or crash before writing the new one).
const keptSerials = 2

// LoadStore reads the store at path; a missing file is an empty store.
// A malformed file is ErrBadStore; the error never quotes the file. So
// is a file that group or others may write (SPEC J1): whoever writes it
// can add a token whose secret they know and have the CA sign a node
// certificate. Reading it is harmless (secrets are kept only hashed).
func LoadStore(path string) (*Store, error) {
	b, mode, err := readStoreFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Store{Version: 1}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("enrollment store: %w", err)
	}
	if mode&0o022 != 0 {
		return nil, fmt.Errorf("enrollment store %s: %w: mode %v lets group or others write it, and so mint join tokens (chmod 600 it)", path, ErrBadStore, mode)
	}
	var s Store
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return nil, fmt.Errorf("enrollment store %s: %w: not JSON (syntax error at byte offset %d)", path, ErrBadStore, syn.Offset)
		}
		return nil, fmt.Errorf("enrollment store %s: %w: %v", path, ErrBadStore, err)
	}
	if s.Version != 1 {
		return nil, fmt.Errorf("enrollment store %s: %w: version %d, want 1", path, ErrBadStore, s.Version)
	}
	ids, names := map[string]bool{}, map[string]bool{}
	for i, t := range s.Tokens {
		if t == nil || t.ID == "" || ids[t.ID] || len(t.SecretSHA256) != 64 {
			return nil, fmt.Errorf("enrollment store %s: %w: tokens[%d] has no unique id or no secret hash", path, ErrBadStore, i)
		}
		ids[t.ID] = true
	}
	for i, n := range s.Nodes {
		if n == nil || n.Name == "" || names[n.Name] {
			return nil, fmt.Errorf("enrollment store %s: %w: nodes[%d] has no unique name", path, ErrBadStore, i)
		}
		names[n.Name] = true
	}
	return &s, nil
}

// readStoreFile reads path and the permission bits of the file it read
// (storefile.Read: a FIFO, a device or a file over storefile.MaxRead is
// refused, SPEC J1).
func readStoreFile(path string) ([]byte, fs.FileMode, error) {
	b, fi, err := storefile.Read(path, storefile.MaxRead)
	if err != nil {
		return nil, 0, err
	}
	return b, fi.Mode().Perm(), nil
}

// Save writes s to path atomically, mode 0600, tokens by creation and
// nodes by name.
func (s *Store) Save(path string) error {
	s.Version = 1
	sort.SliceStable(s.Tokens, func(i, j int) bool { return s.Tokens[i].CreatedAt.Before(s.Tokens[j].CreatedAt) })
	sort.Slice(s.Nodes, func(i, j int) bool { return s.Nodes[i].Name < s.Nodes[j].Name })
	if s.Tokens == nil {
		s.Tokens = []*Token{}
	}
	if s.Nodes == nil {
		s.Nodes = []*NodeRecord{}
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("enrollment store: %w", err)
	}
	if err := storefile.WriteAtomic(path, ".enrollment-*.tmp", append(b, '\n')); err != nil {
		return fmt.Errorf("enrollment store: %w", err)
	}
	return nil
}

// Update runs fn on the store at path under the store's lock and saves
// the store when fn returns nil; an error from fn leaves the file as it
// was. Concurrent Updates (edge tokens create, a join, a renewal, edge
// nodes revoke) never lose one another's change.
func Update(path string, fn func(*Store) error) error {
	_, _, err := update(path, fn)
	return err
}

// update is Update returning the store it saved and the file's stamp
// right after, both taken under the lock.
func update(path string, fn func(*Store) error) (*Store, storefile.Stamp, error) {
	unlock, err := storefile.Lock(path)
	if err != nil {
		return nil, storefile.Stamp{}, fmt.Errorf("enrollment store lock: %w", err)
	}
	defer unlock()
	s, err := LoadStore(path)
	if err != nil {
		return nil, storefile.Stamp{}, err
	}
	if err := fn(s); err != nil {
		return nil, storefile.Stamp{}, err
	}
	if err := s.Save(path); err != nil {
		return nil, storefile.Stamp{}, err
	}
	return s, storefile.StatStamp(path), nil
}

// Token returns the token with that id, or nil.
func (s *Store) Token(id string) *Token {
	for _, t := range s.Tokens {
		if t.ID == id {
			return t
		}
	}
	return nil
}

// Node returns the record of that name, or nil.
func (s *Store) Node(name string) *NodeRecord {
	for _, n := range s.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}
