package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"iop/internal/leakcheck"
)

// The Files and Batch API tried as a hostile key (docs/security.md): each
// case names its bound.

func newManagerWith(t *testing.T, f *fakeEdge, o Options) *Manager {
	t.Helper()
	st, err := Open(t.TempDir(), Limits{MaxFileBytes: 1 << 24, MaxLines: 10000, MaxStorageBytes: 1 << 28}, nil)
	if err != nil {
		t.Fatal(err)
	}
	o.Store = st
	m := New(o)
	m.Bind(f)
	m.Start()
	return m
}

// TestX4BatchesPerKey: a key holds at most batches.max_batches_per_key
// batches that have not ended (each is a driver and up to max_in_flight
// lines: many of them from one file would take the edge); one more is
// refused with 429 naming the bound, another key is not refused, and a
// batch that ended frees its place.
func TestX4BatchesPerKey(t *testing.T) {
	leakcheck.Check(t)
	f := &fakeEdge{served: map[string]int{}, hold: make(chan struct{}), started: make(chan struct{}, 100)}
	type ownerKey struct{}
	m := newManagerWith(t, f, Options{MaxInFlight: 1, MaxPerKey: 2, Owner: func(ctx context.Context) (string, bool) {
		o, ok := ctx.Value(ownerKey{}).(string)
		return o, ok
	}})
	defer m.Close()
	file, _ := m.o.Store.CreateFile("a", "in.jsonl", "batch", strings.NewReader(inputLines(3, nil)))
	p := CreateParams{InputFileID: file.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}
	var ids []string
	for range 2 { // the same file, twice
		b, err := m.Create("a", p)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, b.ID)
	}
	r := httptest.NewRequest("POST", "/v1/batches", strings.NewReader(`{"input_file_id":"`+file.ID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`))
	r = r.WithContext(context.WithValue(r.Context(), ownerKey{}, "a"))
	w := httptest.NewRecorder()
	m.ServeHTTP(w, r)
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), "batches.max_batches_per_key 2") ||
		!strings.Contains(w.Body.String(), `"code":"too_many_batches"`) {
		t.Fatalf("a third batch: %d %s", w.Code, w.Body)
	}
	fb, _ := m.o.Store.CreateFile("b", "in.jsonl", "batch", strings.NewReader(inputLines(1, nil)))
	bb, err := m.Create("b", CreateParams{InputFileID: fb.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatalf("another key is refused: %v", err)
	}
	if _, err := m.Cancel("a", ids[0]); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, m, "a", ids[0])
	b3, err := m.Create("a", p)
	if err != nil {
		t.Fatalf("after one ended: %v", err)
	}
	if _, err := m.Create("a", p); !errors.Is(err, ErrTooManyBatches) {
		t.Fatalf("a third again: %v", err)
	}
	for _, c := range []struct{ owner, id string }{{"a", ids[1]}, {"a", b3.ID}, {"b", bb.ID}} {
		if _, err := m.Cancel(c.owner, c.id); err != nil {
			t.Fatal(err)
		}
		waitEnd(t, m, c.owner, c.id)
	}
}

// TestX2HugeLine: a line longer than the bound of a line
// (http.max_body_bytes and room) is malformed, named with its line
// number and length, and never sent; the other lines run.
func TestX2HugeLine(t *testing.T) {
	leakcheck.Check(t)
	f := &fakeEdge{served: map[string]int{}}
	m := newManagerWith(t, f, Options{MaxInFlight: 2, MaxLineBytes: 64 << 10})
	defer m.Close()
	huge := `{"custom_id":"c2","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny","user":"c2","messages":[{"role":"user","content":"` +
		strings.Repeat("x", 300<<10) + `"}]}}`
	file, err := m.o.Store.CreateFile("k", "in.jsonl", "batch", strings.NewReader(inputLines(4, map[int]string{2: huge})))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create("k", CreateParams{InputFileID: file.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	rec := waitEnd(t, m, "k", b.ID)
	errs := content(t, m, "k", rec.ErrorFileID)
	if rec.Counts != (Counts{Total: 4, Completed: 3, Failed: 1}) || len(errs) != 1 {
		t.Fatalf("batch %s %+v, error file %v", rec.Status, rec.Counts, errs)
	}
	e := errs[0]["error"].(map[string]any)
	if e["line"].(float64) != 2 || !strings.Contains(e["message"].(string), "over the bound of a line (65536") {
		t.Fatalf("the huge line's error: %v", e)
	}
	if f.served["c2"] != 0 {
		t.Fatal("the huge line was sent")
	}
}

// TestX1PathLikeFilename: a filename is a label: it never names a path
// on the edge (files are stored by id), and the download's
// Content-Disposition carries only its last element, so a client saving
// by it writes no other directory.
func TestX1PathLikeFilename(t *testing.T) {
	leakcheck.Check(t)
	type ownerKey struct{}
	m := newManagerWith(t, &fakeEdge{served: map[string]int{}}, Options{Owner: func(ctx context.Context) (string, bool) {
		o, ok := ctx.Value(ownerKey{}).(string)
		return o, ok
	}})
	defer m.Close()
	for _, name := range []string{"../../etc/passwd", `..\..\windows\win.ini`, "/abs/x.jsonl", "a/\x00b", "..", "dir/"} {
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", name)
		io.WriteString(fw, "{}\n")
		mw.WriteField("purpose", "batch")
		mw.Close()
		r := httptest.NewRequest("POST", "/v1/files", &body)
		r.Header.Set("Content-Type", mw.FormDataContentType())
		r = r.WithContext(context.WithValue(r.Context(), ownerKey{}, "a"))
		w := httptest.NewRecorder()
		m.ServeHTTP(w, r)
		if strings.ContainsRune(name, 0) { // not a MIME header: refused, naming it
			if w.Code != 400 || !strings.Contains(w.Body.String(), "malformed MIME header") {
				t.Fatalf("%q: %d %s", name, w.Code, w.Body)
			}
			continue
		}
		var fo struct{ ID, Filename string }
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &fo) != nil {
			t.Fatalf("%q: %d %s", name, w.Code, w.Body)
		}
		r = httptest.NewRequest("GET", "/v1/files/"+fo.ID+"/content", nil)
		r = r.WithContext(context.WithValue(r.Context(), ownerKey{}, "a"))
		w = httptest.NewRecorder()
		m.ServeHTTP(w, r)
		cd := w.Header().Get("Content-Disposition")
		if w.Code != 200 || w.Body.String() != "{}\n" || !strings.HasPrefix(cd, "attachment") || strings.ContainsAny(cd, `/\`) || strings.Contains(cd, "..") {
			t.Fatalf("%q: %d Content-Disposition %q", name, w.Code, cd)
		}
		t.Logf("%q (file object %q) → %q", name, fo.Filename, cd)
	}
}

// TestX4FilesPerKey: the byte bounds count content only, so one key's
// tiny uploads are bounded by number too (batches.max_files_per_key): its
// uploads and outputs count; one more upload is refused 507
// key_storage_full naming the bound and nothing of it kept, another key
// still uploads, a delete frees a place, and a restart counts the same.
func TestX4FilesPerKey(t *testing.T) {
	leakcheck.Check(t)
	dir := t.TempDir()
	lim := Limits{MaxFileBytes: 1000, MaxLines: 100, MaxStorageBytes: 1 << 20, MaxKeyStorageBytes: 1 << 20, MaxKeyFiles: 3}
	st, err := Open(dir, lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	put := func(st *Store, owner string) (*File, error) {
		return st.CreateFile(owner, "in.jsonl", "batch", strings.NewReader("{}\n"))
	}
	first, err := put(st, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := put(st, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutOutput("file-OUT", "a", "out.jsonl", []byte("{}\n"), 1); err != nil {
		t.Fatal(err) // outputs are never refused; they count
	}
	if _, err := put(st, "a"); !errors.Is(err, ErrKeyFiles) || !strings.Contains(err.Error(), "(3: this key has 3 files") {
		t.Fatalf("a's fourth file: %v", err)
	}
	if _, err := put(st, "b"); err != nil {
		t.Fatalf("another key: %v", err)
	}
	if list, _ := st.Files("a", "", "", 10, false); len(list) != 3 {
		t.Fatalf("a's files %d: the refused upload left something", len(list))
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "files")); len(ents) != 8 {
		t.Fatalf("%d entries in files/, want 8 (4 files, content and metadata)", len(ents))
	}
	st.Close()
	st, err = Open(dir, lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := put(st, "a"); !errors.Is(err, ErrKeyFiles) {
		t.Fatalf("after a restart: %v", err)
	}
	if err := st.DeleteFile("a", first.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := put(st, "a"); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
	w := httptest.NewRecorder()
	uploadError(w, fmt.Errorf("%w (x)", ErrKeyFiles))
	if w.Code != http.StatusInsufficientStorage || !strings.Contains(w.Body.String(), `"code":"key_storage_full"`) {
		t.Fatalf("HTTP: %d %s", w.Code, w.Body)
	}
}

// TestX4StoragePerKey: one key cannot fill the directory every key shares
// (batches.max_storage_bytes_per_key): its uploads and its batches'
// outputs count; one more upload is refused 507 key_storage_full naming
// the bound and nothing of it kept, another key still uploads, a delete
// frees the key's room, and a restart counts the same.
func TestX4StoragePerKey(t *testing.T) {
	leakcheck.Check(t)
	dir := t.TempDir()
	lim := Limits{MaxFileBytes: 1000, MaxLines: 100, MaxStorageBytes: 4000, MaxKeyStorageBytes: 1500}
	st, err := Open(dir, lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	put := func(owner string, n int) (*File, error) {
		return st.CreateFile(owner, "in.jsonl", "batch", strings.NewReader(strings.Repeat("x", n-1)+"\n"))
	}
	first, err := put("a", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutOutput("file-OUT", "a", "out.jsonl", []byte(strings.Repeat("o", 299)+"\n"), 1); err != nil {
		t.Fatal(err) // outputs are never refused; they count
	}
	if _, err := put("a", 300); !errors.Is(err, ErrKeyStorage) || !strings.Contains(err.Error(), "of 1500") {
		t.Fatalf("a over its share: %v", err)
	}
	if _, err := put("b", 1000); err != nil {
		t.Fatalf("another key: %v", err)
	}
	if list, _ := st.Files("a", "", "", 10, false); len(list) != 2 || st.Used() != 2300 {
		t.Fatalf("a's files %d, used %d: the refused upload left something", len(list), st.Used())
	}
	st.Close()
	st, err = Open(dir, lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.CreateFile("a", "in.jsonl", "batch", strings.NewReader(strings.Repeat("y", 299)+"\n")); !errors.Is(err, ErrKeyStorage) {
		t.Fatalf("after a restart: %v", err)
	}
	if err := st.DeleteFile("a", first.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateFile("a", "in.jsonl", "batch", strings.NewReader(strings.Repeat("y", 299)+"\n")); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
	w := httptest.NewRecorder()
	uploadError(w, fmt.Errorf("%w (x)", ErrKeyStorage))
	if w.Code != http.StatusInsufficientStorage || !strings.Contains(w.Body.String(), `"code":"key_storage_full"`) {
		t.Fatalf("HTTP: %d %s", w.Code, w.Body)
	}
}
