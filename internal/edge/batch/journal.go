package batch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// Entry is one answered line of a batch, as its journal holds it: the
// line's number in the input file (1-based), whether it goes to the output
// file (a 2xx answer) or the error file, the tokens its answer reported,
// and the output record itself (OpenAI's batch output line: id, custom_id,
// response, error).
type Entry struct {
	Line   int             `json:"line"`
	OK     bool            `json:"ok"`
	In     int64           `json:"in,omitempty"`
	Out    int64           `json:"out,omitempty"`
	Record json.RawMessage `json:"record"`
}

// Journal is a batch's done-set on disk (SPEC X3): one JSON line per
// answered input line, appended with one write(2) each, so that after a
// kill -9 every line whose answer was written is there whole, and the
// batch resumes with the others. A line is answered at most once: Append
// refuses a line already in the journal. A power cut may lose the last
// appends (they are fsynced at Close and before the output files are
// written); those lines run again, each still answered once.
type Journal struct {
	mu   sync.Mutex
	f    *os.File
	s    *Store
	done map[int]bool
	n    Counts
	use  Usage
}

// OpenJournal opens (creating) batch id's journal and reads back what it
// holds: a last line cut short by a crash (no newline, or not JSON) is cut
// off the file, and a line number seen twice keeps its first answer.
func (s *Store) OpenJournal(id string) (*Journal, []Entry, error) {
	p := filepath.Join(s.batchesDir(), id+".journal")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	j := &Journal{f: f, s: s, done: map[int]bool{}}
	var entries []Entry
	good := 0
	for off := 0; off < len(data); {
		nl := bytes.IndexByte(data[off:], '\n')
		if nl < 0 {
			break
		}
		var e Entry
		if json.Unmarshal(data[off:off+nl], &e) != nil || e.Line < 1 {
			break
		}
		off += nl + 1
		good = off
		if j.done[e.Line] {
			continue
		}
		j.count(&e)
		entries = append(entries, e)
	}
	if good < len(data) {
		if err := f.Truncate(int64(good)); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("journal %s: cut its torn end: %w", p, err)
		}
		s.unreserve(int64(len(data) - good))
	}
	if _, err := f.Seek(int64(good), io.SeekStart); err != nil {
		f.Close()
		return nil, nil, err
	}
	return j, entries, nil
}

func (j *Journal) count(e *Entry) {
	j.done[e.Line] = true
	if e.OK {
		j.n.Completed++
	} else {
		j.n.Failed++
	}
	j.use.Input += e.In
	j.use.Output += e.Out
}

// ErrAnswered is Append's error for a line already in the journal.
var ErrAnswered = errors.New("line already answered")

// Append writes e as one line, or refuses a line already answered.
func (j *Journal) Append(e Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.done[e.Line] {
		return ErrAnswered
	}
	if _, err := j.f.Write(b); err != nil {
		return err
	}
	j.s.mu.Lock()
	j.s.used += int64(len(b))
	j.s.mu.Unlock()
	j.count(&e)
	return nil
}

// Done reports whether line is answered.
func (j *Journal) Done(line int) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.done[line]
}

// Counts are the answered lines so far (completed, failed) and their usage.
func (j *Journal) Counts() (Counts, Usage) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.n, j.use
}

// Sync fsyncs the journal.
func (j *Journal) Sync() error { return j.f.Sync() }

// Close fsyncs and closes the journal.
func (j *Journal) Close() error {
	err := j.f.Sync()
	if cerr := j.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// RemoveJournal deletes batch id's journal, once its files are written.
func (s *Store) RemoveJournal(id string) {
	p := filepath.Join(s.batchesDir(), id+".journal")
	if fi, err := os.Stat(p); err == nil {
		s.unreserve(fi.Size())
	}
	_ = os.Remove(p)
}
