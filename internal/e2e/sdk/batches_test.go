package sdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// withBatches turns the Batch and Files API on (batches.dir under the
// stack's directory) and a key store for `edge keys`.
func withBatches(inFlight int) func(*stackOptions) {
	return withConfig(func(ec, _ map[string]any) {
		ec["batches"] = map[string]any{"dir": "batches", "max_in_flight": inFlight, "max_lines": 5000}
		ec["keys"] = map[string]any{"store_file": "keys.json"}
	})
}

// batchInput is n chat-completion lines of model (custom_id "req-<i>"),
// each answering at most maxTokens tokens; line numbers in bad are
// replaced by that text.
func batchInput(n int, model string, maxTokens int, bad map[int]string) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		if s, ok := bad[i]; ok {
			b.WriteString(s + "\n")
			continue
		}
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"line %d"}]}}`+"\n", i, model, maxTokens, i)
	}
	return b.Bytes()
}

// submit uploads input with the SDK and creates a chat-completions batch of it.
func submit(t *testing.T, c *openai.Client, input []byte) *openai.Batch {
	t.Helper()
	ctx := context.Background()
	f, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader(input), "input.jsonl", "application/jsonl"),
		Purpose: openai.FilePurposeBatch})
	if err != nil {
		t.Fatalf("files.create: %v", err)
	}
	if f.Bytes != int64(len(input)) || f.Purpose != "batch" || !strings.HasPrefix(f.ID, "file-") {
		t.Fatalf("file object: %s", f.RawJSON())
	}
	b, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h, Metadata: map[string]string{"job": "e2e"}})
	if err != nil {
		t.Fatalf("batches.create: %v", err)
	}
	if b.InputFileID != f.ID || b.Endpoint != "/v1/chat/completions" || b.CompletionWindow != "24h" || b.Metadata["job"] != "e2e" {
		t.Fatalf("batch object: %s", b.RawJSON())
	}
	return b
}

// pollBatch polls the batch with the SDK, as a client does, until cond
// holds or d passes.
func pollBatch(t *testing.T, c *openai.Client, id string, d time.Duration, cond func(*openai.Batch) bool) *openai.Batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var last string
	for {
		b, err := c.Batches.Get(ctx, id)
		if err == nil && cond(b) {
			return b
		}
		if err != nil {
			last = err.Error()
		} else {
			last = b.RawJSON()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("batch %s: condition not reached within %v; last: %s", id, d, last)
		case <-time.After(100 * time.Millisecond): // poll interval
		}
	}
}

func terminal(b *openai.Batch) bool {
	switch b.Status {
	case "completed", "failed", "cancelled", "expired":
		return true
	}
	return false
}

// outputLine is one line of a batch's output or error file.
type outputLine struct {
	ID       string  `json:"id"`
	CustomID *string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Line    int    `json:"line"`
	} `json:"error"`
}

// download reads file id with the SDK (files.content) as JSONL.
func download(t *testing.T, c *openai.Client, id string) []outputLine {
	t.Helper()
	if id == "" {
		return nil
	}
	resp, err := c.Files.Content(context.Background(), id)
	if err != nil {
		t.Fatalf("files.content %s: %v", id, err)
	}
	defer resp.Body.Close()
	var out []outputLine
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var l outputLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("file %s: line %q: %v", id, sc.Bytes(), err)
		}
		out = append(out, l)
	}
	return out
}

// TestBatches drives the Batch and Files API with the official OpenAI Go
// SDK (SPEC X1-X4): upload, create, poll, download, list; a malformed
// line; cancel; a key revoked while its batch runs; another key's 404.
func TestBatches(t *testing.T) {
	s := newStack(t, withBatches(8))
	c := s.openai()
	ctx := context.Background()

	t.Run("X2 upload create poll download", func(t *testing.T) {
		bad := map[int]string{4: `{"custom_id":"req-4","method":"POST","url":"/v1/chat/completions"`} // cut short
		b := submit(t, c, batchInput(20, "tiny", 4, bad))
		b = pollBatch(t, c, b.ID, 60*time.Second, terminal)
		if b.Status != "completed" || b.RequestCounts.Total != 20 || b.RequestCounts.Completed != 19 || b.RequestCounts.Failed != 1 ||
			b.OutputFileID == "" || b.ErrorFileID == "" || b.CompletedAt == 0 || b.InProgressAt == 0 || b.Model != "tiny" {
			t.Fatalf("batch: %s", b.RawJSON())
		}
		out := download(t, c, b.OutputFileID)
		seen := map[string]bool{}
		for _, l := range out {
			var chat openai.ChatCompletion
			if l.CustomID == nil || l.Response == nil || l.Response.StatusCode != 200 || l.Error != nil || l.Response.RequestID == "" ||
				json.Unmarshal(l.Response.Body, &chat) != nil || len(chat.Choices) == 0 || seen[*l.CustomID] {
				t.Fatalf("output line %+v", l)
			}
			seen[*l.CustomID] = true
		}
		if len(out) != 19 || seen["req-4"] {
			t.Fatalf("%d output lines (req-4 in it: %v)", len(out), seen["req-4"])
		}
		errs := download(t, c, b.ErrorFileID)
		if len(errs) != 1 || errs[0].Error == nil || errs[0].Error.Line != 4 || errs[0].Response != nil {
			t.Fatalf("error file: %+v", errs)
		}
		t.Logf("malformed line 4: %s", errs[0].Error.Message)
		page, err := c.Batches.List(ctx, openai.BatchListParams{})
		if err != nil || len(page.Data) == 0 || page.Data[0].ID != b.ID {
			t.Fatalf("batches.list: %v %+v", err, page)
		}
		files, err := c.Files.List(ctx, openai.FileListParams{})
		if err != nil || len(files.Data) < 3 {
			t.Fatalf("files.list: %v %+v", err, files)
		}
		if _, err := c.Batches.Cancel(ctx, b.ID); !isStatus(err, 409) {
			t.Fatalf("cancel of a completed batch: %v", err)
		}
		if d, err := c.Files.Delete(ctx, b.OutputFileID); err != nil || !d.Deleted {
			t.Fatalf("files.delete: %v %+v", err, d)
		}
		if _, err := c.Files.Get(ctx, b.OutputFileID); !isStatus(err, 404) {
			t.Fatalf("a deleted file: %v", err)
		}
	})

	t.Run("X1 bounds", func(t *testing.T) {
		_, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader(batchInput(5001, "tiny", 1, nil)), "big.jsonl", "application/jsonl"),
			Purpose: openai.FilePurposeBatch})
		if !isStatus(err, 400) || !strings.Contains(errMessage(err), "batches.max_lines") {
			t.Fatalf("5001 lines: %v: %s", err, errMessage(err))
		}
		t.Logf("5001 lines: %s", errMessage(err))
		_, err = c.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader([]byte("{}\n")), "x.jsonl", "application/jsonl"),
			Purpose: openai.FilePurposeFineTune})
		if !isStatus(err, 400) || !strings.Contains(errMessage(err), "purpose") {
			t.Fatalf("purpose fine-tune: %v", err)
		}
	})

	t.Run("X2 cancel", func(t *testing.T) {
		b := submit(t, c, batchInput(400, "tiny", 16, nil))
		pollBatch(t, c, b.ID, 60*time.Second, func(b *openai.Batch) bool { return b.RequestCounts.Completed > 0 })
		cb, err := c.Batches.Cancel(ctx, b.ID)
		if err != nil || (cb.Status != "cancelling" && cb.Status != "cancelled") {
			t.Fatalf("batches.cancel: %v %s", err, cb.RawJSON())
		}
		b = pollBatch(t, c, b.ID, 30*time.Second, terminal)
		if b.Status != "cancelled" || b.CancelledAt == 0 || b.RequestCounts.Completed >= 400 || b.OutputFileID == "" {
			t.Fatalf("after cancel: %s", b.RawJSON())
		}
		if out := download(t, c, b.OutputFileID); int64(len(out)) != b.RequestCounts.Completed {
			t.Fatalf("%d output lines, request_counts.completed %d", len(out), b.RequestCounts.Completed)
		}
	})

	t.Run("X4 a line for a model outside its key's scope, another key's file", func(t *testing.T) {
		out, err := runOnce(filepath.Join(s.env.bin, "edge"), "keys", "create", "-config", s.edgeConfig, "-name", "team-c", "-models", "tiny")
		if err != nil {
			t.Fatalf("edge keys create: %v\n%s", err, out)
		}
		kc := s.openai(option.WithAPIKey(lastKey(out)))
		input := append(batchInput(3, "tiny", 4, nil), bytes.ReplaceAll(batchInput(2, "tiny-loop", 4, nil), []byte(`"req-`), []byte(`"loop-`))...)
		var b *openai.Batch
		pollUntil(t, 10*time.Second, func() bool { // the key store is re-read within a second
			_, err := kc.Files.List(ctx, openai.FileListParams{})
			return err == nil
		})
		b = submit(t, kc, input)
		b = pollBatch(t, kc, b.ID, 60*time.Second, terminal)
		if b.Status != "completed" || b.RequestCounts.Completed != 3 || b.RequestCounts.Failed != 2 {
			t.Fatalf("batch: %s", b.RawJSON())
		}
		for _, l := range download(t, kc, b.ErrorFileID) {
			if l.CustomID == nil || !strings.HasPrefix(*l.CustomID, "loop-") || l.Response == nil || l.Response.StatusCode/100 != 4 ||
				!strings.Contains(string(l.Response.Body), "tiny-loop") {
				t.Fatalf("error line %+v %s", l, l.Response.Body)
			}
			t.Logf("%s: %d %s", *l.CustomID, l.Response.StatusCode, l.Response.Body)
		}
		// The demo key cannot read team-c's files, nor make a batch of them.
		if _, err := c.Files.Content(ctx, b.OutputFileID); !isStatus(err, 404) {
			t.Fatalf("the demo key reads team-c's output: %v", err)
		}
		if _, err := c.Files.Get(ctx, b.InputFileID); !isStatus(err, 404) {
			t.Fatalf("the demo key reads team-c's input: %v", err)
		}
		if _, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: b.InputFileID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
			CompletionWindow: openai.BatchNewParamsCompletionWindow24h}); !isStatus(err, 400) {
			t.Fatalf("the demo key makes a batch of team-c's file: %v", err)
		}
		if _, err := c.Files.Delete(ctx, b.InputFileID); !isStatus(err, 404) {
			t.Fatalf("the demo key deletes team-c's file: %v", err)
		}
	})

	t.Run("X4 a revoked key stops its batches", func(t *testing.T) {
		out, err := runOnce(filepath.Join(s.env.bin, "edge"), "keys", "create", "-config", s.edgeConfig, "-name", "team-b")
		if err != nil {
			t.Fatalf("edge keys create: %v\n%s", err, out)
		}
		key := lastKey(out)
		kb := s.openai(option.WithAPIKey(key))
		b := submit(t, kb, batchInput(400, "tiny", 16, nil))
		if _, err := c.Batches.Get(ctx, b.ID); !isStatus(err, 404) {
			t.Fatalf("the demo key reads team-b's batch: %v", err)
		}
		pollBatch(t, kb, b.ID, 60*time.Second, func(b *openai.Batch) bool { return b.RequestCounts.Completed > 0 })
		if out, err := runOnce(filepath.Join(s.env.bin, "edge"), "keys", "revoke", "-config", s.edgeConfig, "-name", "team-b"); err != nil {
			t.Fatalf("edge keys revoke: %v\n%s", err, out)
		}
		if _, err := kb.Batches.Get(ctx, b.ID); err == nil {
			// the key store is re-read within a second: poll until it is
			pollUntil(t, 10*time.Second, func() bool { _, err := kb.Batches.Get(ctx, b.ID); return isStatus(err, 401) })
		}
		// The key cannot look any more: the record on disk says what happened.
		var rec struct {
			Status string `json:"status"`
			Errors []struct {
				Code string `json:"code"`
			} `json:"errors"`
			Counts struct {
				Completed int `json:"completed"`
			} `json:"request_counts"`
		}
		pollUntil(t, 30*time.Second, func() bool {
			b, err := os.ReadFile(filepath.Join(s.dir, "batches", "batches", b.ID+".json"))
			return err == nil && json.Unmarshal(b, &rec) == nil && rec.Status == "cancelled"
		})
		if len(rec.Errors) != 1 || rec.Errors[0].Code != "api_key_revoked" || rec.Counts.Completed >= 400 {
			t.Fatalf("team-b's batch after the revocation: %+v", rec)
		}
	})
}

// TestBatchBoundsAsConfigured: the bounds a hostile key meets, as the
// binaries wire them from the config (SPEC X2, X4): a line longer than
// http.max_body_bytes + 64 KiB (here 1 MiB + 64 KiB) is malformed with its
// number and the others run; a key with batches.max_batches_per_key
// batches that have not ended gets 429 too_many_batches, another key not.
func TestBatchBoundsAsConfigured(t *testing.T) {
	s := newStack(t, withBatches(1), withConfig(func(ec, _ map[string]any) {
		ec["batches"].(map[string]any)["max_batches_per_key"] = 2
		ec["http"] = map[string]any{"max_body_bytes": 1 << 20}
	}))
	c := s.openai()
	ctx := context.Background()
	huge := `{"custom_id":"huge","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny","messages":[{"role":"user","content":"` +
		strings.Repeat("x", 2<<20) + `"}]}}`
	b := submit(t, c, batchInput(3, "tiny", 2, map[int]string{2: huge}))
	b = pollBatch(t, c, b.ID, 60*time.Second, terminal)
	errs := download(t, c, b.ErrorFileID)
	if b.Status != "completed" || b.RequestCounts.Completed != 2 || len(errs) != 1 || errs[0].Error == nil || errs[0].Error.Line != 2 ||
		!strings.Contains(errs[0].Error.Message, "over the bound of a line (1114112") {
		t.Fatalf("batch %s, error file %+v", b.RawJSON(), errs)
	}
	t.Logf("line 2: %s", errs[0].Error.Message)
	// Two long batches hold the key's places; a third is refused.
	var live []string
	for range 2 {
		live = append(live, submit(t, c, batchInput(400, "tiny", 16, nil)).ID)
	}
	f, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader(batchInput(1, "tiny", 1, nil)), "one.jsonl", "application/jsonl"),
		Purpose: openai.FilePurposeBatch})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	if !isStatus(err, 429) || !strings.Contains(errMessage(err), "too_many_batches") || !strings.Contains(errMessage(err), "batches.max_batches_per_key 2") {
		t.Fatalf("a third batch: %v: %s", err, errMessage(err))
	}
	t.Logf("a third batch: %s", errMessage(err))
	for _, id := range live {
		if _, err := c.Batches.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		pollBatch(t, c, id, 30*time.Second, terminal)
	}
	if _, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h}); err != nil {
		t.Fatalf("after the two ended: %v", err)
	}
}

// TestBatchKill9 kills the edge (SIGKILL) in the middle of a 2,000-line
// batch and starts it again (SPEC X3): the batch resumes and its output has
// 2,000 lines, each custom_id once.
func TestBatchKill9(t *testing.T) {
	s := newStack(t, withBatches(16))
	c := s.openai()
	const n = 2000
	b := submit(t, c, batchInput(n, "tiny", 2, nil))
	before := pollBatch(t, c, b.ID, 120*time.Second, func(b *openai.Batch) bool { return b.RequestCounts.Completed >= 300 })
	// X6: /status and /metrics show the key's batch in progress.
	resp, err := s.hc.Get("http://" + s.adminAddr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Batches []struct {
			Principal string `json:"principal"`
			Batches   int    `json:"batches"`
			Lines     int    `json:"lines"`
			Oldest    string `json:"oldest"`
		} `json:"batches"`
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || len(st.Batches) != 1 || st.Batches[0].Principal != "demo" || st.Batches[0].Batches != 1 ||
		st.Batches[0].Lines != n || st.Batches[0].Oldest != b.ID {
		t.Fatalf("/status batches: %v %+v", err, st.Batches)
	}
	fams := s.scrape(t)
	inProgress, lines := fams["iop_edge_batches_in_progress"], fams["iop_edge_batch_lines_total"]
	if inProgress == nil || len(inProgress.Metric) != 1 || labels(inProgress.Metric[0])["principal"] != "demo" ||
		inProgress.Metric[0].GetGauge().GetValue() != 1 || lines == nil || len(lines.Metric) != 2 {
		t.Fatalf("/metrics batch families: %v %v", inProgress, lines)
	}
	// X5, G4: the lines were served in the batch class.
	batchClass := uint64(0)
	for _, m := range fams["iop_edge_key_queue_wait_seconds"].GetMetric() {
		if l := labels(m); l["key"] == "demo" && l["class"] == "batch" {
			batchClass += m.GetHistogram().GetSampleCount()
		} else if l["key"] == "demo" {
			t.Errorf("a line of the batch queued in class %s", l["class"])
		}
	}
	if batchClass < 300 {
		t.Fatalf("%d requests of the demo key in the batch class, want ≥ 300", batchClass)
	}
	if err := s.edge.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := s.edge.wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed the edge at %d of %d lines answered (status %s)", before.RequestCounts.Completed, n, before.Status)
	s.startEdge()
	s.waitHTTP("http://"+s.httpAddr+"/healthz", 20*time.Second)
	s.waitConnected(true, readyTimeout)
	b = pollBatch(t, c, b.ID, 180*time.Second, terminal)
	if b.Status != "completed" || b.RequestCounts.Completed != n || b.RequestCounts.Failed != 0 {
		t.Fatalf("after the restart: %s", b.RawJSON())
	}
	out := download(t, c, b.OutputFileID)
	seen := map[string]int{}
	for _, l := range out {
		if l.CustomID == nil || l.Response == nil || l.Response.StatusCode != 200 {
			t.Fatalf("output line %+v", l)
		}
		seen[*l.CustomID]++
	}
	for i := 1; i <= n; i++ {
		if k := fmt.Sprintf("req-%d", i); seen[k] != 1 {
			t.Errorf("%s is %d times in the output", k, seen[k])
		}
	}
	if len(out) != n {
		t.Fatalf("%d output lines, want %d", len(out), n)
	}
}

func isStatus(err error, status int) bool {
	var ae *openai.Error
	return errors.As(err, &ae) && ae.StatusCode == status
}

// errMessage is an API error's message and code as the SDK parsed them.
func errMessage(err error) string {
	var ae *openai.Error
	if errors.As(err, &ae) {
		return ae.Message + " (" + ae.Code + ", param " + ae.Param + ")"
	}
	return fmt.Sprint(err)
}

// lastKey is the API key `edge keys create` printed (its last line).
func lastKey(out string) string {
	key := ""
	for _, l := range strings.Split(out, "\n") {
		if f := strings.TrimSpace(l); strings.HasPrefix(f, "iop-") {
			key = f
		}
	}
	return key
}

// pollUntil polls cond until it holds or d passes.
func pollUntil(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached within %v", d)
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
}
