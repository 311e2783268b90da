package batch

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var testLimits = Limits{MaxFileBytes: 1 << 20, MaxLines: 10, MaxStorageBytes: 4 << 20}

func openTest(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, testLimits, func() time.Time { return time.Unix(1_800_000_000, 0) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestX1FileLimits: each bound refuses with its error and keeps nothing.
func TestX1FileLimits(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	for _, r := range []struct {
		name    string
		content string
		want    error
	}{
		{"X1 too many lines", strings.Repeat("{}\n", 11), ErrTooMany},
		{"X1 too many lines without a last newline", strings.Repeat("{}\n", 10) + "{}", ErrTooMany},
		{"X1 too large", strings.Repeat("x", 1<<20+1), ErrTooLarge},
		{"X1 empty", "", ErrEmptyInput},
	} {
		t.Run(r.name, func(t *testing.T) {
			if _, err := s.CreateFile("a", "in.jsonl", "batch", strings.NewReader(r.content)); !errors.Is(err, r.want) {
				t.Fatalf("err = %v, want %v", err, r.want)
			}
			if list, _ := s.Files("a", "", "", 100, false); len(list) != 0 {
				t.Fatalf("a refused file was kept: %+v", list)
			}
			if u := s.Used(); u != 0 {
				t.Fatalf("used = %d after a refusal", u)
			}
		})
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "files"))
	if len(ents) != 0 {
		t.Fatalf("files/ holds %d entries after refusals", len(ents))
	}
	// Storage: 4 uploads of 1 MiB fill it; the fifth is refused.
	big := strings.Repeat("y", 1<<20-1) + "\n"
	for i := 0; i < 4; i++ {
		if _, err := s.CreateFile("a", "big", "batch", strings.NewReader(big)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.CreateFile("b", "big", "batch", strings.NewReader("z\n")); !errors.Is(err, ErrStorage) {
		t.Fatalf("over storage: err = %v", err)
	}
}

// TestX4FilesBelongToTheirOwner: another key sees none of them.
func TestX4FilesBelongToTheirOwner(t *testing.T) {
	s := openTest(t, t.TempDir())
	f, err := s.CreateFile("a", "in.jsonl", "batch", strings.NewReader("{}\n{}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Lines != 2 || f.Bytes != 6 {
		t.Fatalf("file = %+v", f)
	}
	if _, err := s.File("b", f.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("b reads a's file: %v", err)
	}
	if _, _, err := s.Content("b", f.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("b reads a's content: %v", err)
	}
	if err := s.DeleteFile("b", f.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("b deletes a's file: %v", err)
	}
	if list, _ := s.Files("b", "", "", 10, false); len(list) != 0 {
		t.Fatalf("b lists %v", list)
	}
	r := &Record{Machine: Machine{Status: InProgress}, ID: "batch_1", Owner: "a", InputFileID: f.ID}
	if err := s.PutBatch(r); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Batch("b", r.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("b reads a's batch: %v", err)
	}
	if err := s.DeleteFile("a", f.ID); !errors.Is(err, ErrInUse) {
		t.Fatalf("deleting a live batch's input: %v", err)
	}
	c, _, err := s.Content("a", f.ID)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "{}\n{}\n" {
		t.Fatalf("content %q", b)
	}
}

// TestX3StoreSurvivesRestart: files and batches are there after a new
// Open; an upload cut between its two renames leaves nothing; a second
// edge on the same dir is refused.
func TestX3StoreSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	if _, err := Open(dir, testLimits, nil); !errors.Is(err, ErrLocked) {
		t.Fatalf("second edge on one dir: %v", err)
	}
	f, err := s.CreateFile("a", "in.jsonl", "batch", strings.NewReader("{}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := &Record{Machine: Machine{Status: InProgress}, ID: "batch_1", Owner: "a", InputFileID: f.ID, CreatedAt: 5}
	if err := s.PutBatch(r); err != nil {
		t.Fatal(err)
	}
	// A crash between the content's rename and the metadata's, and one
	// mid-upload.
	if err := os.WriteFile(filepath.Join(dir, "files", "file-ORPHAN.data"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "files", ".upload-1.tmp"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2 := openTest(t, dir)
	if g, err := s2.File("a", f.ID); err != nil || *g != *f {
		t.Fatalf("file after restart = %+v, %v; want %+v", g, err, f)
	}
	if live := s2.Live(); len(live) != 1 || live[0].ID != r.ID || live[0].Status != InProgress {
		t.Fatalf("live after restart = %+v", live)
	}
	for _, n := range []string{"file-ORPHAN.data", ".upload-1.tmp"} {
		if _, err := os.Stat(filepath.Join(dir, "files", n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", n, err)
		}
	}
	if u := s2.Used(); u != f.Bytes {
		t.Fatalf("used = %d, want %d", u, f.Bytes)
	}
}

// TestX3JournalTornEnd: a last line cut by a crash is cut off, a line is
// answered once, what was answered is read back.
func TestX3JournalTornEnd(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	j, entries, err := s.OpenJournal("batch_1")
	if err != nil || len(entries) != 0 {
		t.Fatal(entries, err)
	}
	for _, e := range []Entry{{Line: 1, OK: true, In: 3, Record: []byte(`{"custom_id":"a"}`)}, {Line: 2, Record: []byte(`{"custom_id":"b"}`)}} {
		if err := j.Append(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Append(Entry{Line: 1, OK: true, Record: []byte(`{}`)}); !errors.Is(err, ErrAnswered) {
		t.Fatalf("line 1 twice: %v", err)
	}
	j.Close()
	p := filepath.Join(dir, "batches", "batch_1.journal")
	f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"line":3,"ok":true,"rec`) // the crash
	f.Close()
	j, entries, err = s.OpenJournal("batch_1")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if len(entries) != 2 || entries[0].Line != 1 || entries[1].Line != 2 {
		t.Fatalf("entries = %+v", entries)
	}
	if n, u := j.Counts(); n != (Counts{Completed: 1, Failed: 1}) || u.Input != 3 {
		t.Fatalf("counts = %+v %+v", n, u)
	}
	if j.Done(3) || !j.Done(2) {
		t.Fatal("done set wrong")
	}
	if err := j.Append(Entry{Line: 3, OK: true, Record: []byte(`{"custom_id":"c"}`)}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if got := strings.Count(string(b), "\n"); got != 3 || !strings.HasSuffix(string(b), "\"c\"}}\n") {
		t.Fatalf("journal after the torn end:\n%s", b)
	}
}
