// Package secretstore is the Edge's secret store (SPEC C1): upstream
// provider secrets kept encrypted at rest in one JSON file, one slot per
// secret, each with a revision that rises with every write.
//
// Encryption: AES-256-GCM under a 32-byte store key kept in its own file
// (mode 0600), a fresh random 96-bit nonce per write, and as associated
// data the domain string "iop secret store v1", the slot name and the
// revision — a ciphertext moved to another slot or given another revision
// does not open.
//
// Writers (edge secrets set, rm) hold Lock from reading the file to writing
// it; the Edge reads it without (the write is a rename).
//
// File format (mode 0600, written atomically by rename):
//
//	{"version": 1, "slots": [{"name": "openai-prod", "revision": 3,
//	  "updated_at": "<RFC 3339>", "nonce": "<base64>", "ciphertext": "<base64>"}]}
//
// A removed slot stays as a tombstone without nonce and ciphertext, so
// that setting it again continues its revisions (a Node rejects leases of
// a revision older than the one it knows, SPEC C6).
//
// The package never logs and never puts a secret, a ciphertext or the key
// into an error message. Open returns a plaintext the caller must clear().
package secretstore

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"iop/internal/lease"
	"iop/internal/storefile"
)

// KeySize is the store key's size in bytes (AES-256).
const KeySize = 32

// MaxSecretBytes bounds one secret.
const MaxSecretBytes = 16 << 10

// Errors; test with errors.Is.
var (
	ErrNoSlot      = errors.New("no such slot")
	ErrBadSlotName = errors.New("invalid slot name")
	ErrBadSecret   = errors.New("invalid secret")
	ErrBadKey      = errors.New("invalid store key")
	ErrKeyExposed  = errors.New("store key file is readable by others")
	ErrBadStore    = errors.New("invalid secret store")
	ErrDecrypt     = errors.New("slot does not decrypt with this store key")
	ErrExists      = errors.New("file exists")
)

const aadDomain = "iop secret store v1"

var slotRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidSlotName reports whether name is a slot name: 1–63 of letters,
// digits, '.', '_', '-', starting with a letter or digit.
func ValidSlotName(name string) bool { return slotRE.MatchString(name) }

// Key is a store key. Clear it with Clear when done.
type Key struct{ b [KeySize]byte }

// Clear zeroes the key.
func (k *Key) Clear() { clear(k.b[:]) }

// WriteNewKey writes a fresh random store key to path with mode 0600 and
// refuses to overwrite an existing file (ErrExists).
func WriteNewKey(path string) error {
	var k Key
	defer k.Clear()
	_, _ = rand.Read(k.b[:])
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("store key %s: %w (remove it first; the slots it encrypts are lost with it)", path, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("store key: %w", err)
	}
	if _, err := f.Write(k.b[:]); err != nil {
		f.Close()
		return fmt.Errorf("store key %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("store key %s: %w", path, err)
	}
	return nil
}

// LoadKey reads a store key file: exactly KeySize bytes, not readable by
// group or others (ErrKeyExposed).
func LoadKey(path string) (*Key, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("store key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("store key %s: %w (mode %v; chmod 600 it)", path, ErrKeyExposed, fi.Mode().Perm())
	}
	b, _, err := storefile.Read(path, 4096) // a FIFO or a device is never waited on
	if err != nil {
		return nil, fmt.Errorf("store key: %w", err)
	}
	defer clear(b)
	if len(b) != KeySize {
		return nil, fmt.Errorf("store key %s: %w: %d bytes, want %d (`edge secrets init` writes one)", path, ErrBadKey, len(b), KeySize)
	}
	k := &Key{}
	copy(k.b[:], b)
	return k, nil
}

// Slot is one slot's public facts.
type Slot struct {
	Name      string
	Revision  uint64
	UpdatedAt time.Time
}

// entry is one slot in the file. Nonce and Ciphertext are empty for a
// removed slot (a tombstone keeping its revision).
type entry struct {
	Name       string    `json:"name"`
	Revision   uint64    `json:"revision"`
	UpdatedAt  time.Time `json:"updated_at"`
	Nonce      []byte    `json:"nonce,omitempty"`
	Ciphertext []byte    `json:"ciphertext,omitempty"`
}

func (e *entry) live() bool { return len(e.Ciphertext) > 0 }

type file struct {
	Version int      `json:"version"`
	Slots   []*entry `json:"slots"`
}

// Store is a loaded secret store: ciphertexts and revisions, no plaintext.
// It is not safe for concurrent mutation; Open and the readers may run
// concurrently once it is no longer changed.
type Store struct {
	slots map[string]*entry
}

// New returns an empty store.
func New() *Store { return &Store{slots: map[string]*entry{}} }

// Load reads the store file at path. A missing file is an fs.ErrNotExist
// error; a malformed one is ErrBadStore naming what is wrong.
func Load(path string) (*Store, error) {
	b, _, err := storefile.Read(path, storefile.MaxRead)
	if err != nil {
		return nil, fmt.Errorf("secret store: %w", err)
	}
	var f file
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("secret store %s: %w: %s", path, ErrBadStore, jsonProblem(err))
	}
	if f.Version != 1 {
		return nil, fmt.Errorf("secret store %s: %w: version %d, want 1", path, ErrBadStore, f.Version)
	}
	s := New()
	for i, e := range f.Slots {
		switch {
		case e == nil || !ValidSlotName(e.Name):
			return nil, fmt.Errorf("secret store %s: %w: slots[%d]: invalid name", path, ErrBadStore, i)
		case s.slots[e.Name] != nil:
			return nil, fmt.Errorf("secret store %s: %w: slot %q twice", path, ErrBadStore, e.Name)
		case e.Revision == 0:
			return nil, fmt.Errorf("secret store %s: %w: slot %q has revision 0", path, ErrBadStore, e.Name)
		case e.live() && len(e.Nonce) != 12:
			return nil, fmt.Errorf("secret store %s: %w: slot %q: nonce of %d bytes, want 12", path, ErrBadStore, e.Name, len(e.Nonce))
		case e.live() && len(e.Ciphertext) < 17:
			return nil, fmt.Errorf("secret store %s: %w: slot %q: ciphertext too short", path, ErrBadStore, e.Name)
		}
		s.slots[e.Name] = e
	}
	return s, nil
}

// jsonProblem describes a decoding error of the store file without quoting
// the file: encoding/json's syntax errors quote the offending byte, which
// would put a byte of whatever the path names — a store key given as the
// store, another secret file — into a log line.
func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("not JSON (syntax error at byte offset %d)", syn.Offset)
	case errors.As(err, &typ):
		return fmt.Sprintf("%s holds a JSON %s, want %v", typ.Field, strings.Fields(typ.Value)[0], typ.Type)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "not JSON (truncated)"
	}
	return err.Error() // unknown fields (named by key) and base64 errors (by offset)
}

// Lock takes the store's writer lock (storefile.Lock: an flock on
// path + ".lock", waiting while another writer holds it) and returns its
// release. Writers hold it from Load to Save so that two concurrent `edge
// secrets set` do not both read the old file and lose one slot to the
// other's rename; readers need none (Save renames atomically).
func Lock(path string) (unlock func(), err error) {
	unlock, err = storefile.Lock(path)
	if err != nil {
		return nil, fmt.Errorf("secret store %w", err)
	}
	return unlock, nil
}

// LoadOrNew is Load, or an empty store when path does not exist.
func LoadOrNew(path string) (*Store, error) {
	s, err := Load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return New(), nil
	}
	return s, err
}

// Save writes the store to path atomically (storefile.WriteAtomic: a
// temporary file in the same directory, fsync, rename) with mode 0600.
func (s *Store) Save(path string) error {
	f := file{Version: 1, Slots: make([]*entry, 0, len(s.slots))}
	for _, name := range s.names(true) {
		f.Slots = append(f.Slots, s.slots[name])
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("secret store: %w", err)
	}
	if err := storefile.WriteAtomic(path, ".secrets-*.tmp", append(b, '\n')); err != nil {
		return fmt.Errorf("secret store: %w", err)
	}
	return nil
}

// Set encrypts secret into slot name under k with a fresh nonce and the
// next revision (1 for a new slot), and returns that revision. secret is
// not retained. Errors: ErrBadSlotName, ErrBadSecret (empty, over
// MaxSecretBytes, or not usable as an HTTP header value unchanged:
// lease.CheckHeaderValue — a control character, or a leading or trailing
// space).
func (s *Store) Set(k *Key, name string, secret []byte, now time.Time) (uint64, error) {
	if !ValidSlotName(name) {
		return 0, fmt.Errorf("%w %q (1-63 of letters, digits, '.', '_', '-')", ErrBadSlotName, name)
	}
	if len(secret) == 0 || len(secret) > MaxSecretBytes {
		return 0, fmt.Errorf("%w: %d bytes (want 1..%d)", ErrBadSecret, len(secret), MaxSecretBytes)
	}
	if err := lease.CheckHeaderValue(secret); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrBadSecret, err)
	}
	rev := uint64(1)
	if old := s.slots[name]; old != nil {
		rev = old.Revision + 1
	}
	aead, err := newAEAD(k)
	if err != nil {
		return 0, err
	}
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	ct := aead.Seal(nil, nonce, secret, aad(name, rev))
	s.slots[name] = &entry{Name: name, Revision: rev, UpdatedAt: now.UTC().Truncate(time.Second), Nonce: nonce, Ciphertext: ct}
	return rev, nil
}

// Remove deletes slot name's secret, keeping its revision as a tombstone.
// It reports whether the slot held a secret.
func (s *Store) Remove(name string, now time.Time) bool {
	e := s.slots[name]
	if e == nil || !e.live() {
		return false
	}
	s.slots[name] = &entry{Name: name, Revision: e.Revision, UpdatedAt: now.UTC().Truncate(time.Second)}
	return true
}

// Removed reports whether slot name held a secret that Remove took out
// (`edge secrets rm`): its tombstone is in the store. A name never set is
// not removed.
func (s *Store) Removed(name string) bool {
	e := s.slots[name]
	return e != nil && !e.live()
}

// Slots lists the slots holding a secret, by name.
func (s *Store) Slots() []Slot {
	var out []Slot
	for _, name := range s.names(false) {
		e := s.slots[name]
		out = append(out, Slot{Name: e.Name, Revision: e.Revision, UpdatedAt: e.UpdatedAt})
	}
	return out
}

// Revision is slot name's current revision; ok is false when it holds no
// secret.
func (s *Store) Revision(name string) (rev uint64, ok bool) {
	e := s.slots[name]
	if e == nil || !e.live() {
		return 0, false
	}
	return e.Revision, true
}

// Open decrypts slot name under k and returns the secret and its revision.
// The caller must clear() the secret after use. Errors: ErrNoSlot,
// ErrDecrypt (wrong key, or a ciphertext moved or edited).
func (s *Store) Open(k *Key, name string) ([]byte, uint64, error) {
	e := s.slots[name]
	if e == nil || !e.live() {
		return nil, 0, fmt.Errorf("%w %q", ErrNoSlot, name)
	}
	aead, err := newAEAD(k)
	if err != nil {
		return nil, 0, err
	}
	pt, err := aead.Open(nil, e.Nonce, e.Ciphertext, aad(name, e.Revision))
	if err != nil {
		return nil, 0, fmt.Errorf("slot %q: %w", name, ErrDecrypt)
	}
	return pt, e.Revision, nil
}

func (s *Store) names(withTombstones bool) []string {
	names := make([]string, 0, len(s.slots))
	for name, e := range s.slots {
		if withTombstones || e.live() {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

func newAEAD(k *Key) (cipher.AEAD, error) {
	if k == nil {
		return nil, ErrBadKey
	}
	block, err := aes.NewCipher(k.b[:])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadKey, err)
	}
	return cipher.NewGCM(block)
}

// aad is the associated data of slot name at revision rev.
func aad(name string, rev uint64) []byte {
	out := make([]byte, 0, len(aadDomain)+1+len(name)+1+8)
	out = append(out, aadDomain...)
	out = append(out, 0)
	out = append(out, name...)
	out = append(out, 0)
	return binary.BigEndian.AppendUint64(out, rev)
}
