package batch

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"iop/internal/storefile"
)

// Errors of the store; test with errors.Is. The HTTP layer maps each to its
// status (http.go).
var (
	ErrNotFound   = errors.New("no such object")
	ErrTooLarge   = errors.New("file over batches.max_file_bytes")
	ErrTooMany    = errors.New("file over batches.max_lines")
	ErrStorage    = errors.New("batches.dir over batches.max_storage_bytes")
	ErrKeyStorage = errors.New("the key's files over batches.max_storage_bytes_per_key")
	ErrKeyFiles   = errors.New("the key's files over batches.max_files_per_key")
	ErrInUse      = errors.New("file is the input of a batch that has not ended")
	ErrLocked     = errors.New("batches.dir is in use by another edge")
	ErrEmptyInput = errors.New("file has no line")
)

// Limits bound the store (batches.*, docs/config.md).
type Limits struct {
	MaxFileBytes    int64
	MaxLines        int
	MaxStorageBytes int64
	// MaxKeyStorageBytes bounds the files of one owner (its uploads and
	// its batches' outputs) so that one key cannot fill the directory
	// every key shares; 0 = no bound of its own.
	MaxKeyStorageBytes int64
	// MaxKeyFiles bounds the number of files of one owner (its uploads
	// and its batches' outputs): the byte bounds count content only, so
	// without it a key could keep millions of tiny files, each taking a
	// disk block, an inode and a read at every start; 0 = no bound.
	MaxKeyFiles int
}

// File is one stored file's metadata (OpenAI's file object plus its owner
// and line count). Its content is files/<id>.data, its metadata
// files/<id>.json.
type File struct {
	ID        string `json:"id"`
	Owner     string `json:"owner"` // the key's name; "" in open mode
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"` // "batch" (uploads), "batch_output" (outputs)
	Bytes     int64  `json:"bytes"`
	Lines     int    `json:"lines"`
	CreatedAt int64  `json:"created_at"` // Unix s
}

// Counts are a batch's request_counts.
type Counts struct {
	Total     int64 `json:"total"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
}

// Usage sums the token usage the lines' answers reported.
type Usage struct {
	Input  int64 `json:"input_tokens"`
	Output int64 `json:"output_tokens"`
}

// BatchError is one entry of a batch's "errors" (OpenAI's BatchError):
// why the batch failed or stopped.
type BatchError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Line    int    `json:"line,omitempty"`
	Param   string `json:"param,omitempty"`
}

// Record is one batch as the store keeps it (batches/<id>.json), written
// at each change of status; the lines' answers are in its journal.
type Record struct {
	Machine
	ID               string            `json:"id"`
	Owner            string            `json:"owner"`
	Endpoint         string            `json:"endpoint"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Model            string            `json:"model,omitempty"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	OutputFileID     string            `json:"output_file_id,omitempty"`
	ErrorFileID      string            `json:"error_file_id,omitempty"`
	Errors           []BatchError      `json:"errors,omitempty"`
	Counts           Counts            `json:"request_counts"`
	Usage            Usage             `json:"usage"`
	// Times, Unix s; 0 = not yet.
	CreatedAt    int64 `json:"created_at"`
	ExpiresAt    int64 `json:"expires_at"`
	InProgressAt int64 `json:"in_progress_at,omitempty"`
	FinalizingAt int64 `json:"finalizing_at,omitempty"`
	CompletedAt  int64 `json:"completed_at,omitempty"`
	FailedAt     int64 `json:"failed_at,omitempty"`
	CancellingAt int64 `json:"cancelling_at,omitempty"`
	CancelledAt  int64 `json:"cancelled_at,omitempty"`
	ExpiredAt    int64 `json:"expired_at,omitempty"`
}

// Store keeps the files and batches of one edge in batches.dir (SPEC X3):
//
//	edge.lock             flock(2)ed by the edge for its whole life: one edge per dir
//	files/<id>.data       a file's content, renamed into place whole
//	files/<id>.json       its metadata (storefile.WriteAtomic), written after the content
//	batches/<id>.json     a batch's record (storefile.WriteAtomic) at each change of status
//	batches/<id>.journal  its answered lines, one JSON line each, appended (journal.go)
//
// A file is there when its metadata is: content without metadata (a crash
// between the two renames) and temporary files are removed at Open.
// Safe for concurrent use.
type Store struct {
	dir  string
	lim  Limits
	lock *os.File
	now  func() time.Time

	mu      sync.Mutex
	files   map[string]*File
	batches map[string]*Record
	used    int64            // bytes of every file and journal under dir
	byOwner map[string]int64 // bytes of each owner's files (uploads and outputs)
	nOwner  map[string]int   // files of each owner (uploads and outputs)
}

// Open locks dir (creating it, mode 0700) and loads what it holds. Errors:
// ErrLocked when another edge holds it; an unreadable record or metadata
// file is an error naming it (nothing is dropped silently).
func Open(dir string, lim Limits, now func() time.Time) (*Store, error) {
	if now == nil {
		now = time.Now
	}
	for _, d := range []string{dir, filepath.Join(dir, "files"), filepath.Join(dir, "batches")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("batches.dir: %w", err)
		}
	}
	lf, err := os.OpenFile(filepath.Join(dir, "edge.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("batches.dir: %w", err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lf.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (each edge needs its own batches.dir)", ErrLocked, dir)
		}
		return nil, fmt.Errorf("batches.dir: lock: %w", err)
	}
	s := &Store{dir: dir, lim: lim, lock: lf, now: now, files: map[string]*File{}, batches: map[string]*Record{}, byOwner: map[string]int64{},
		nOwner: map[string]int{}}
	if err := s.load(); err != nil {
		lf.Close()
		return nil, err
	}
	return s, nil
}

// Close releases the lock.
func (s *Store) Close() error { return s.lock.Close() }

func (s *Store) filesDir() string   { return filepath.Join(s.dir, "files") }
func (s *Store) batchesDir() string { return filepath.Join(s.dir, "batches") }
func (s *Store) dataPath(id string) string {
	return filepath.Join(s.filesDir(), id+".data")
}

func (s *Store) load() error {
	ents, err := os.ReadDir(s.filesDir())
	if err != nil {
		return fmt.Errorf("batches.dir: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, ".tmp"):
			_ = os.Remove(filepath.Join(s.filesDir(), name))
		case strings.HasSuffix(name, ".json"):
			var f File
			p := filepath.Join(s.filesDir(), name)
			b, err := os.ReadFile(p)
			if err == nil {
				err = json.Unmarshal(b, &f)
			}
			if err != nil || f.ID+".json" != name {
				return fmt.Errorf("batches.dir: file metadata %s: unreadable (%v); move it away to start", p, err)
			}
			fi, err := os.Stat(s.dataPath(f.ID))
			if err != nil { // metadata without content: cannot happen by our writes (content first)
				return fmt.Errorf("batches.dir: file %s has metadata but no content (%v)", f.ID, err)
			}
			s.files[f.ID] = &f
			s.used += fi.Size()
			s.byOwner[f.Owner] += fi.Size()
			s.nOwner[f.Owner]++
		}
	}
	for _, e := range ents { // content whose metadata never came: an upload cut by a crash
		if id, ok := strings.CutSuffix(e.Name(), ".data"); ok && s.files[id] == nil {
			_ = os.Remove(filepath.Join(s.filesDir(), e.Name()))
		}
	}
	ents, err = os.ReadDir(s.batchesDir())
	if err != nil {
		return fmt.Errorf("batches.dir: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		p := filepath.Join(s.batchesDir(), name)
		switch {
		case strings.HasSuffix(name, ".tmp"):
			_ = os.Remove(p)
		case strings.HasSuffix(name, ".journal"):
			if fi, err := e.Info(); err == nil {
				s.used += fi.Size()
			}
		case strings.HasSuffix(name, ".json"):
			var r Record
			b, err := os.ReadFile(p)
			if err == nil {
				err = json.Unmarshal(b, &r)
			}
			if err != nil || r.ID+".json" != name {
				return fmt.Errorf("batches.dir: batch record %s: unreadable (%v); move it away to start", p, err)
			}
			s.batches[r.ID] = &r
		}
	}
	return nil
}

// NewFileID is a new file id: "file-" and 26 characters of crypto/rand
// base32 (OpenAI's ids are "file-" and an opaque token).
func NewFileID() string { return "file-" + rand.Text() }

// NewBatchID is a new batch id: "batch_" and 26 lowercase base32 characters.
func NewBatchID() string { return "batch_" + strings.ToLower(rand.Text()) }

// CreateFile stores the content r gives as a new file of owner (SPEC X1):
// written to a temporary file, fsynced and renamed into place, then its
// metadata. It refuses, and keeps nothing of, content over
// Limits.MaxFileBytes (ErrTooLarge), over Limits.MaxLines lines
// (ErrTooMany; a last line without a newline counts) or that would take
// the dir over Limits.MaxStorageBytes (ErrStorage), that would give owner
// more than Limits.MaxKeyFiles files (ErrKeyFiles), and empty content
// (ErrEmptyInput).
func (s *Store) CreateFile(owner, filename, purpose string, r io.Reader) (*File, error) {
	tmp, err := os.CreateTemp(s.filesDir(), ".upload-*.tmp")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	defer tmp.Close()
	w := &countingWriter{w: tmp, max: s.lim.MaxFileBytes, maxLines: s.lim.MaxLines}
	if err := s.reserve(owner, 0); err != nil {
		return nil, err
	}
	if _, err := io.Copy(w, r); err != nil {
		return nil, err
	}
	if w.n == 0 {
		return nil, ErrEmptyInput
	}
	if w.last != '\n' {
		w.lines++
		if s.lim.MaxLines > 0 && w.lines > s.lim.MaxLines {
			return nil, fmt.Errorf("%w (%d)", ErrTooMany, s.lim.MaxLines)
		}
	}
	if err := s.reserve(owner, w.n); err != nil {
		return nil, err
	}
	release := true
	defer func() {
		if release {
			s.unreserve(w.n)
			s.mu.Lock()
			s.byOwner[owner] -= w.n
			s.nOwner[owner]--
			s.mu.Unlock()
		}
	}()
	if err := tmp.Sync(); err != nil {
		return nil, err
	}
	f := &File{ID: NewFileID(), Owner: owner, Filename: filename, Purpose: purpose, Bytes: w.n, Lines: w.lines, CreatedAt: s.now().Unix()}
	if err := os.Rename(tmp.Name(), s.dataPath(f.ID)); err != nil {
		return nil, err
	}
	if err := s.putFileMeta(f); err != nil {
		_ = os.Remove(s.dataPath(f.ID))
		return nil, err
	}
	release = false
	s.mu.Lock()
	s.files[f.ID] = f
	s.mu.Unlock()
	return f, nil
}

// PutOutput writes data as file id of owner (a batch's output or error
// file, purpose "batch_output"), replacing one of that id: writing the
// files of a batch again after a crash gives the same files. Outputs
// count toward the storage bound but are never refused by it.
func (s *Store) PutOutput(id, owner, filename string, data []byte, lines int) (*File, error) {
	if err := storefile.WriteAtomic(s.dataPath(id), ".output-*.tmp", data); err != nil {
		return nil, err
	}
	f := &File{ID: id, Owner: owner, Filename: filename, Purpose: "batch_output", Bytes: int64(len(data)), Lines: lines, CreatedAt: s.now().Unix()}
	if err := s.putFileMeta(f); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if old := s.files[id]; old != nil {
		s.used -= old.Bytes
		s.byOwner[old.Owner] -= old.Bytes
		s.nOwner[old.Owner]--
	}
	s.used += f.Bytes
	s.byOwner[owner] += f.Bytes
	s.nOwner[owner]++
	s.files[id] = f
	s.mu.Unlock()
	return f, nil
}

func (s *Store) putFileMeta(f *File) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return storefile.WriteAtomic(filepath.Join(s.filesDir(), f.ID+".json"), ".meta-*.tmp", b)
}

// reserve adds n bytes of owner's to the dir's use, or refuses with
// ErrKeyFiles when owner already has Limits.MaxKeyFiles files,
// ErrKeyStorage when that would pass Limits.MaxKeyStorageBytes for owner,
// ErrStorage when it would pass Limits.MaxStorageBytes (n = 0: refuses
// when already at a bound). n > 0 also takes one of owner's
// Limits.MaxKeyFiles places.
func (s *Store) reserve(owner string, n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	over := func(used, most int64) bool { return most > 0 && (used+n > most || n == 0 && used >= most) }
	if most := s.lim.MaxKeyFiles; most > 0 && s.nOwner[owner] >= most {
		return fmt.Errorf("%w (%d: this key has %d files; delete files you no longer need)", ErrKeyFiles, most, s.nOwner[owner])
	}
	if over(s.byOwner[owner], s.lim.MaxKeyStorageBytes) {
		return fmt.Errorf("%w (%d bytes of this key's in use of %d; delete files you no longer need)", ErrKeyStorage, s.byOwner[owner], s.lim.MaxKeyStorageBytes)
	}
	if over(s.used, s.lim.MaxStorageBytes) {
		return fmt.Errorf("%w (%d bytes in use of %d; delete files you no longer need)", ErrStorage, s.used, s.lim.MaxStorageBytes)
	}
	s.used += n
	s.byOwner[owner] += n
	if n > 0 {
		s.nOwner[owner]++ // the file's place, held from here
	}
	return nil
}

func (s *Store) unreserve(n int64) {
	s.mu.Lock()
	s.used -= n
	s.mu.Unlock()
}

// Used is the bytes of every file and journal under the dir.
func (s *Store) Used() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// File returns owner's file id (ErrNotFound for a file of another owner:
// a key never learns that another key's file exists, SPEC X4).
func (s *Store) File(owner, id string) (*File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.files[id]
	if f == nil || f.Owner != owner {
		return nil, ErrNotFound
	}
	c := *f
	return &c, nil
}

// Files lists owner's files, newest first (desc) or oldest first, of
// purpose ("" = any), after the file of id after ("" = from the start), at
// most limit; more reports whether more follow.
func (s *Store) Files(owner, purpose, after string, limit int, asc bool) (list []File, more bool) {
	s.mu.Lock()
	for _, f := range s.files {
		if f.Owner == owner && (purpose == "" || f.Purpose == purpose) {
			list = append(list, *f)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b File) int {
		c := int(a.CreatedAt - b.CreatedAt)
		if c == 0 {
			c = strings.Compare(a.ID, b.ID)
		}
		if !asc {
			c = -c
		}
		return c
	})
	return page(list, func(f File) string { return f.ID }, after, limit)
}

// page cuts list after the element of id after, to at most limit.
func page[T any](list []T, id func(T) string, after string, limit int) ([]T, bool) {
	if after != "" {
		for i := range list {
			if id(list[i]) == after {
				list = list[i+1:]
				break
			}
		}
	}
	if len(list) > limit {
		return list[:limit], true
	}
	return list, false
}

// Content opens owner's file id for reading.
func (s *Store) Content(owner, id string) (*os.File, *File, error) {
	f, err := s.File(owner, id)
	if err != nil {
		return nil, nil, err
	}
	c, err := os.Open(s.dataPath(id))
	if err != nil {
		return nil, nil, err
	}
	return c, f, nil
}

// DeleteFile removes owner's file id: its metadata first (then it is
// gone, whatever a crash leaves), then its content. ErrInUse while a batch
// that has not ended reads it.
func (s *Store) DeleteFile(owner, id string) error {
	s.mu.Lock()
	f := s.files[id]
	if f == nil || f.Owner != owner {
		s.mu.Unlock()
		return ErrNotFound
	}
	for _, b := range s.batches {
		if b.InputFileID == id && !b.Status.Terminal() {
			s.mu.Unlock()
			return fmt.Errorf("%w (%s is %s)", ErrInUse, b.ID, b.Status)
		}
	}
	delete(s.files, id)
	s.used -= f.Bytes
	s.byOwner[owner] -= f.Bytes
	s.nOwner[owner]--
	s.mu.Unlock()
	if err := os.Remove(filepath.Join(s.filesDir(), id+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	_ = storefile.SyncDir(s.filesDir())
	_ = os.Remove(s.dataPath(id))
	return nil
}

// PutBatch writes r (storefile.WriteAtomic) and makes it the store's.
func (s *Store) PutBatch(r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := storefile.WriteAtomic(filepath.Join(s.batchesDir(), r.ID+".json"), ".batch-*.tmp", b); err != nil {
		return err
	}
	c := *r
	s.mu.Lock()
	s.batches[r.ID] = &c
	s.mu.Unlock()
	return nil
}

// Batch returns owner's batch id (ErrNotFound for another owner's).
func (s *Store) Batch(owner, id string) (*Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.batches[id]
	if r == nil || r.Owner != owner {
		return nil, ErrNotFound
	}
	c := *r
	return &c, nil
}

// Batches lists owner's batches, newest first, after the batch of id
// after, at most limit.
func (s *Store) Batches(owner, after string, limit int) ([]Record, bool) {
	s.mu.Lock()
	var list []Record
	for _, r := range s.batches {
		if r.Owner == owner {
			list = append(list, *r)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b Record) int {
		if c := int(b.CreatedAt - a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	return page(list, func(r Record) string { return r.ID }, after, limit)
}

// Live lists the batches that have not ended, oldest first: what the edge
// resumes at start (SPEC X3).
func (s *Store) Live() []Record {
	s.mu.Lock()
	var list []Record
	for _, r := range s.batches {
		if !r.Status.Terminal() {
			list = append(list, *r)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b Record) int {
		if c := int(a.CreatedAt - b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return list
}

// countingWriter counts bytes and newlines and refuses past max bytes or
// maxLines newlines.
type countingWriter struct {
	w        io.Writer
	n, max   int64
	lines    int
	maxLines int
	last     byte
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.max > 0 && c.n+int64(len(p)) > c.max {
		return 0, fmt.Errorf("%w (%d bytes)", ErrTooLarge, c.max)
	}
	c.lines += bytes.Count(p, []byte{'\n'})
	if c.maxLines > 0 && c.lines > c.maxLines {
		return 0, fmt.Errorf("%w (%d)", ErrTooMany, c.maxLines)
	}
	if len(p) > 0 {
		c.last = p[len(p)-1]
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// lineReader is a bufio.Reader over a file, for scanning lines of any
// length up to the file's.
func lineReader(r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, 64<<10) }
