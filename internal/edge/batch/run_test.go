package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/leakcheck"
)

// fakeEdge answers chat completions as the client handler would: the
// model's answer echoing the request, 400 for model "bad", 429 with
// Retry-After: 0 for the first refuse429 requests, and blocks each request
// while hold is set.
type fakeEdge struct {
	mu       sync.Mutex
	served   map[string]int // custom_id (from the body's user) → times served
	refuse   atomic.Int64
	inFlight atomic.Int64
	maxSeen  atomic.Int64
	hold     chan struct{} // nil = answer at once
	started  chan struct{} // one send per request started, when set
	priority []string
}

func (f *fakeEdge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for {
		m := f.maxSeen.Load()
		if n <= m || f.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	var body struct {
		Model string `json:"model"`
		User  string `json:"user"`
	}
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &body)
	f.mu.Lock()
	f.priority = append(f.priority, r.Header.Get(PriorityHeader))
	f.mu.Unlock()
	if f.refuse.Add(-1) >= 0 {
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"message":"slow down","type":"rate_limit_error"}}`)
		return
	}
	if f.started != nil {
		f.started <- struct{}{}
	}
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-r.Context().Done():
			panic(http.ErrAbortHandler) // as the api handler does for a client gone before any byte
		}
	}
	f.mu.Lock()
	f.served[body.User]++
	f.mu.Unlock()
	w.Header().Set("X-Request-Id", "req-"+body.User)
	if body.Model == "unloadable" { // the edge's answer when every provider said model_unavailable (SPEC U3)
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"the model could not be loaded on its provider (no memory for it, or its load failed); retry later","type":"server_error","param":null,"code":"model_unavailable"}}`)
		return
	}
	if body.Model == "bad" {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"message":"no such model","type":"invalid_request_error"}}`)
		return
	}
	fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"message":{"role":"assistant","content":"hi %s"}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`, body.User)
}

func inputLines(n int, bad map[int]string) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		if s, ok := bad[i]; ok {
			b.WriteString(s + "\n")
			continue
		}
		fmt.Fprintf(&b, `{"custom_id":"c%d","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny","user":"c%d","messages":[{"role":"user","content":"hi"}]}}`+"\n", i, i)
	}
	return b.String()
}

func newManager(t *testing.T, dir string, f *fakeEdge, inFlight int) *Manager {
	t.Helper()
	st, err := Open(dir, Limits{MaxFileBytes: 1 << 24, MaxLines: 10000, MaxStorageBytes: 1 << 28}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := New(Options{Store: st, MaxInFlight: inFlight})
	m.Bind(f)
	m.Start()
	return m
}

// waitEnd waits for the batch's driver to return and gives its record.
func waitEnd(t *testing.T, m *Manager, owner, id string) *Record {
	t.Helper()
	if c := m.ended(id); c != nil {
		<-c
	}
	r, err := m.Get(owner, id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func content(t *testing.T, m *Manager, owner, id string) []map[string]any {
	t.Helper()
	if id == "" {
		return nil
	}
	c, _, err := m.o.Store.Content(owner, id)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, _ := io.ReadAll(c)
	var out []map[string]any
	for _, l := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		var v map[string]any
		if err := json.Unmarshal(l, &v); err != nil {
			t.Fatalf("output line %q: %v", l, err)
		}
		out = append(out, v)
	}
	return out
}

// X5, U3: a 503 model_unavailable is no "no provider for now": every
// provider of the group said it cannot load the model, so the line is
// answered with it (the error file) instead of running again every second
// until the 24-hour window ends; a 429 still waits and runs again.
func TestX5ModelUnavailableIsAnswered(t *testing.T) {
	leakcheck.Check(t)
	f := &fakeEdge{served: map[string]int{}}
	f.refuse.Store(1)
	m := newManager(t, t.TempDir(), f, 1)
	defer m.Close()
	in := inputLines(2, map[int]string{
		1: `{"custom_id":"c1","method":"POST","url":"/v1/chat/completions","body":{"model":"unloadable","user":"c1"}}`})
	file, err := m.o.Store.CreateFile("team-a", "in.jsonl", "batch", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create("team-a", CreateParams{InputFileID: file.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	if c := m.ended(b.ID); c != nil {
		select {
		case <-c:
		case <-time.After(30 * time.Second): // a bound for the failure, not a wait for an event
			f.mu.Lock()
			defer f.mu.Unlock()
			t.Fatalf("the batch has not ended: the model_unavailable line ran %d times", f.served["c1"])
		}
	}
	r := waitEnd(t, m, "team-a", b.ID)
	if r.Status != Completed || r.Counts != (Counts{Total: 2, Completed: 1, Failed: 1}) {
		t.Fatalf("batch = %s %+v", r.Status, r.Counts)
	}
	errs := content(t, m, "team-a", r.ErrorFileID)
	if len(errs) != 1 || errs[0]["custom_id"] != "c1" || errs[0]["response"].(map[string]any)["status_code"].(float64) != 503 {
		t.Fatalf("error file %v", errs)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.served["c1"] != 1 || f.served["c2"] != 1 {
		t.Fatalf("served %v: the model_unavailable line ran again", f.served)
	}
}

// TestX2BatchRuns: every line answered once, in OpenAI's line shapes: a
// 2xx in the output file, an upstream 400 and each malformed line (with
// its line number) in the error file; a 429 waits and runs again; every
// line carries Iop-Priority: batch; at most max_in_flight at once.
func TestX2BatchRuns(t *testing.T) {
	leakcheck.Check(t)
	f := &fakeEdge{served: map[string]int{}}
	f.refuse.Store(3)
	m := newManager(t, t.TempDir(), f, 4)
	defer m.Close()
	bad := map[int]string{
		3:  `not json`,
		5:  `{"custom_id":"c5","method":"GET","url":"/v1/chat/completions","body":{"model":"tiny"}}`,
		7:  `{"custom_id":"c7","method":"POST","url":"/v1/embeddings","body":{"model":"tiny"}}`,
		9:  `{"custom_id":"c1","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny"}}`,
		11: `{"custom_id":"c11","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny","stream":true}}`,
		13: `{"custom_id":"c13","method":"POST","url":"/v1/chat/completions","body":{"model":"bad","user":"c13"}}`,
	}
	file, err := m.o.Store.CreateFile("team-a", "in.jsonl", "batch", strings.NewReader(inputLines(40, bad)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create("team-a", CreateParams{InputFileID: file.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	r := waitEnd(t, m, "team-a", b.ID)
	if r.Status != Completed || r.Counts != (Counts{Total: 40, Completed: 34, Failed: 6}) {
		t.Fatalf("batch = %s %+v", r.Status, r.Counts)
	}
	if r.Usage.Input != 34*3 || r.Usage.Output != 34*2 || r.Model != "tiny" {
		t.Fatalf("usage %+v model %q", r.Usage, r.Model)
	}
	out, errs := content(t, m, "team-a", r.OutputFileID), content(t, m, "team-a", r.ErrorFileID)
	if len(out) != 34 || len(errs) != 6 {
		t.Fatalf("output %d lines, errors %d", len(out), len(errs))
	}
	for _, o := range out {
		resp := o["response"].(map[string]any)
		if resp["status_code"].(float64) != 200 || resp["request_id"] != "req-"+o["custom_id"].(string) || o["error"] != nil ||
			!strings.HasPrefix(o["id"].(string), "batch_req_") {
			t.Fatalf("output line %v", o)
		}
	}
	lines := map[float64]bool{}
	for _, e := range errs {
		if e["custom_id"] == "c13" {
			if e["response"].(map[string]any)["status_code"].(float64) != 400 {
				t.Fatalf("upstream 400 line %v", e)
			}
			continue
		}
		if e["response"] != nil {
			t.Fatalf("malformed line has a response: %v", e)
		}
		lines[e["error"].(map[string]any)["line"].(float64)] = true
	}
	for _, n := range []float64{3, 5, 7, 9, 11} {
		if !lines[n] {
			t.Errorf("malformed line %v not in the error file: %v", n, errs)
		}
	}
	for cid, n := range f.served {
		if n != 1 {
			t.Errorf("%s served %d times", cid, n)
		}
	}
	if got := f.maxSeen.Load(); got > 4 {
		t.Errorf("%d lines in flight at once, max_in_flight 4", got)
	}
	for _, p := range f.priority {
		if p != PriorityBatch {
			t.Fatalf("a line without %s: batch: %q", PriorityHeader, p)
		}
	}
}

// TestX3ResumeAfterStop: a batch stopped mid-run (the edge closing, as a
// crash stops it) resumes at the next start; each line is answered once in
// the output; the lines in flight at the stop ran again.
func TestX3ResumeAfterStop(t *testing.T) {
	leakcheck.Check(t)
	dir := t.TempDir()
	f := &fakeEdge{served: map[string]int{}, hold: make(chan struct{}), started: make(chan struct{}, 100)}
	m := newManager(t, dir, f, 3)
	file, err := m.o.Store.CreateFile("", "in.jsonl", "batch", strings.NewReader(inputLines(30, nil)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create("", CreateParams{InputFileID: file.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ { // let ten lines through, then hold three
		<-f.started
		f.hold <- struct{}{}
	}
	for i := 0; i < 3; i++ {
		<-f.started
	}
	m.Close()
	f2 := &fakeEdge{served: map[string]int{}}
	st, err := Open(dir, Limits{MaxFileBytes: 1 << 24, MaxLines: 10000, MaxStorageBytes: 1 << 28}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	m2 := New(Options{Store: st, MaxInFlight: 3, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	m2.Bind(f2)
	m2.Start()
	defer m2.Close()
	if l := logs.String(); !strings.Contains(l, `msg="batch resumed" batch=`+b.ID+" ") || !strings.Contains(l, "status=in_progress") {
		t.Fatalf("the restart does not log the batch it resumes:\n%s", l)
	}
	r := waitEnd(t, m2, "", b.ID)
	out := content(t, m2, "", r.OutputFileID)
	if r.Status != Completed || len(out) != 30 || r.Counts.Completed != 30 {
		t.Fatalf("after resume: %s %+v, %d output lines", r.Status, r.Counts, len(out))
	}
	seen := map[string]bool{}
	for _, o := range out {
		cid := o["custom_id"].(string)
		if seen[cid] {
			t.Fatalf("%s twice in the output", cid)
		}
		seen[cid] = true
	}
	if n := len(f.served) + len(f2.served); n != 30 {
		t.Fatalf("%d + %d lines served: the three in flight at the stop run again, the others once", len(f.served), len(f2.served))
	}
}

// TestX2Cancel: a cancelled batch stops its lines in flight and is
// cancelled with the answers it had; a cancelled batch is not
// cancellable again.
func TestX2Cancel(t *testing.T) {
	leakcheck.Check(t)
	f := &fakeEdge{served: map[string]int{}, hold: make(chan struct{}), started: make(chan struct{}, 100)}
	m := newManager(t, t.TempDir(), f, 2)
	defer m.Close()
	file, _ := m.o.Store.CreateFile("k", "in.jsonl", "batch", strings.NewReader(inputLines(10, nil)))
	b, err := m.Create("k", CreateParams{InputFileID: file.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	<-f.started
	f.hold <- struct{}{}
	<-f.started
	<-f.started
	if _, err := m.Cancel("other", b.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another key cancels: %v", err)
	}
	c, err := m.Cancel("k", b.ID)
	if err != nil || c.Status != Cancelling {
		t.Fatalf("cancel: %v %v", c, err)
	}
	r := waitEnd(t, m, "k", b.ID)
	if r.Status != Cancelled || r.Counts.Completed != 1 || r.CancelledAt == 0 {
		t.Fatalf("after cancel: %s %+v", r.Status, r.Counts)
	}
	var nc *ErrNotCancellable
	if _, err := m.Cancel("k", b.ID); !errors.As(err, &nc) {
		t.Fatalf("second cancel: %v", err)
	}
}

// TestX1UploadOverHTTP: the multipart upload as the SDKs send it, each
// bound's status and error, another key's 404.
func TestX1UploadOverHTTP(t *testing.T) {
	leakcheck.Check(t)
	st, err := Open(t.TempDir(), Limits{MaxFileBytes: 1000, MaxLines: 3, MaxStorageBytes: 2000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	type ownerKey struct{}
	m := New(Options{Store: st, Owner: func(ctx context.Context) (string, bool) {
		o, ok := ctx.Value(ownerKey{}).(string)
		return o, ok
	}})
	defer m.Close()
	do := func(owner, method, path string, body io.Reader, ctype string) (int, map[string]any) {
		r := httptest.NewRequest(method, path, body)
		r = r.WithContext(context.WithValue(r.Context(), ownerKey{}, owner))
		if ctype != "" {
			r.Header.Set("Content-Type", ctype)
		}
		w := httptest.NewRecorder()
		m.ServeHTTP(w, r)
		var v map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &v)
		return w.Code, v
	}
	upload := func(owner, purpose, content string) (int, map[string]any) {
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		fw, _ := mw.CreateFormFile("file", "in.jsonl")
		io.WriteString(fw, content)
		mw.WriteField("purpose", purpose)
		mw.Close()
		return do(owner, "POST", "/v1/files", &b, mw.FormDataContentType())
	}
	for _, r := range []struct {
		name, purpose, content string
		status                 int
		code                   string
	}{
		{"X1 over max_file_bytes", "batch", strings.Repeat("x", 1001), 413, "file_too_large"},
		{"X1 over max_lines", "batch", "{}\n{}\n{}\n{}\n", 400, "too_many_lines"},
		{"X1 empty", "batch", "", 400, "empty_file"},
		{"X1 another purpose", "fine-tune", "{}\n", 400, "invalid_request"},
	} {
		t.Run(r.name, func(t *testing.T) {
			status, v := upload("a", r.purpose, r.content)
			e, _ := v["error"].(map[string]any)
			if status != r.status || e == nil || e["code"] != r.code || e["message"] == "" {
				t.Fatalf("%d %v, want %d %s", status, v, r.status, r.code)
			}
		})
	}
	if list, _ := st.Files("a", "", "", 100, false); len(list) != 0 || st.Used() != 0 {
		t.Fatalf("refused uploads left %v (%d bytes)", list, st.Used())
	}
	status, v := upload("a", "batch", "{}\n{}\n")
	if status != 200 || v["object"] != "file" || v["bytes"].(float64) != 6 || v["purpose"] != "batch" || v["filename"] != "in.jsonl" {
		t.Fatalf("upload: %d %v", status, v)
	}
	id := v["id"].(string)
	if status, _ := do("b", "GET", "/v1/files/"+id, nil, ""); status != 404 {
		t.Fatalf("another key reads a's file: %d", status)
	}
	if status, v := do("b", "GET", "/v1/files", nil, ""); status != 200 || len(v["data"].([]any)) != 0 {
		t.Fatalf("another key lists: %d %v", status, v)
	}
	if status, v := do("a", "GET", "/v1/files", nil, ""); status != 200 || len(v["data"].([]any)) != 1 || v["first_id"] != id {
		t.Fatalf("list: %d %v", status, v)
	}
	upload("a", "batch", strings.Repeat("y", 999)+"\n") // 1006 of 2000 bytes
	if status, v := upload("a", "batch", strings.Repeat("z", 999)+"\n"); status != 507 {
		t.Fatalf("over max_storage_bytes: %d %v", status, v)
	}
	if status, v := do("b", "POST", "/v1/batches", strings.NewReader(`{"input_file_id":"`+id+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`), ""); status != 400 || v["error"].(map[string]any)["param"] != "input_file_id" {
		t.Fatalf("another key's file as a batch's input: %d %v", status, v)
	}
	if status, v := do("a", "POST", "/v1/batches", strings.NewReader(`{"input_file_id":"`+id+`","endpoint":"/v1/moderations","completion_window":"24h"}`), ""); status != 400 || v["error"].(map[string]any)["param"] != "endpoint" {
		t.Fatalf("an endpoint the edge does not batch: %d %v", status, v)
	}
	if status, v := do("a", "DELETE", "/v1/files/"+id, nil, ""); status != 200 || v["deleted"] != true {
		t.Fatalf("delete: %d %v", status, v)
	}
}

// TestX6BatchesInProgress: the batches that have not ended, per key, for
// /status, the page and /metrics.
func TestX6BatchesInProgress(t *testing.T) {
	leakcheck.Check(t)
	f := &fakeEdge{served: map[string]int{}, hold: make(chan struct{}), started: make(chan struct{}, 100)}
	m := newManager(t, t.TempDir(), f, 2)
	defer m.Close()
	var ids []string
	for _, owner := range []string{"team-b", "team-a", "team-a"} {
		file, _ := m.o.Store.CreateFile(owner, "in.jsonl", "batch", strings.NewReader(inputLines(5, nil)))
		b, err := m.Create(owner, CreateParams{InputFileID: file.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, b.ID)
	}
	for i := 0; i < 6; i++ { // two lines of each batch in flight
		<-f.started
	}
	got := m.InProgress()
	if len(got) != 2 || got[0].Principal != "team-a" || got[0].Batches != 2 || got[0].Lines != 10 || got[0].InFlight != 4 ||
		got[1].Principal != "team-b" || got[1].Batches != 1 || got[1].InFlight != 2 || got[1].Oldest != ids[0] {
		t.Fatalf("in progress: %+v", got)
	}
	var b strings.Builder
	if err := m.WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`iop_edge_batches_in_progress{principal="team-a"} 2`, `iop_edge_batch_lines_in_flight{principal="team-b"} 2`,
		"# TYPE iop_edge_batch_lines_total counter", "iop_edge_batch_storage_bytes "} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, b.String())
		}
	}
	for i, id := range ids {
		owner := "team-a"
		if i == 0 {
			owner = "team-b"
		}
		if _, err := m.Cancel(owner, id); err != nil {
			t.Fatal(err)
		}
		waitEnd(t, m, owner, id)
	}
	if got := m.InProgress(); len(got) != 0 {
		t.Fatalf("after cancelling every batch: %+v", got)
	}
}

// lockedBuffer is a bytes.Buffer a logger may write from several
// goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
