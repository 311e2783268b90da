package batch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// A line's answer and the files written from the journal (SPEC X2): the
// recorder a line is served into, the output line's shape (OpenAI's
// request output object), and the output and error files.

// maxAnswer bounds the answer of one line the driver holds (bytes); a
// larger one is the line's error response_too_large.
const maxAnswer = 32 << 20

// recorder is the ResponseWriter of a line: status, headers and up to
// maxAnswer bytes of the body.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
	over   bool
}

func (w *recorder) Header() http.Header { return w.header }

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *recorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.body.Len()+len(p) > maxAnswer {
		w.over = true
		return 0, errors.New("batch line answer over its bound")
	}
	return w.body.Write(p)
}

func (w *recorder) Flush() {}

// Output line shapes (OpenAI API reference, "The request output object").
type outResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

type outError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Line    int    `json:"line,omitempty"`
}

type outLine struct {
	ID       string       `json:"id"`
	CustomID *string      `json:"custom_id"`
	Response *outResponse `json:"response"`
	Error    *outError    `json:"error"`
}

func requestID(batchID string, no int) string {
	return "batch_req_" + strings.TrimPrefix(batchID, "batch_") + "_" + strconv.Itoa(no)
}

func errorRecord(batchID string, l line, code, msg string) json.RawMessage {
	o := outLine{ID: requestID(batchID, l.no), Error: &outError{Code: code, Message: msg, Line: l.no}}
	if l.customID != "" {
		o.CustomID = &l.customID
	}
	b, _ := json.Marshal(o)
	return b
}

// answer is a served line's entry: the output file's for a 2xx, the error
// file's otherwise, with the answer's status, request id and body.
func answer(batchID string, l line, w *recorder) Entry {
	if w.over {
		return Entry{Line: l.no, Record: errorRecord(batchID, l, "response_too_large", fmt.Sprintf("the answer is over %d bytes", maxAnswer))}
	}
	if w.status == 0 {
		w.status = http.StatusOK
	}
	body := w.body.Bytes()
	if !json.Valid(body) {
		body, _ = json.Marshal(string(body))
	}
	cid := l.customID
	o := outLine{ID: requestID(batchID, l.no), CustomID: &cid,
		Response: &outResponse{StatusCode: w.status, RequestID: w.header.Get("X-Request-Id"), Body: body}}
	b, _ := json.Marshal(o)
	e := Entry{Line: l.no, OK: w.status/100 == 2, Record: b}
	var u struct {
		Usage struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
			Input      int64 `json:"input_tokens"`
			Output     int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	if e.OK && json.Unmarshal(body, &u) == nil {
		e.In = max(u.Usage.Prompt, u.Usage.Input)
		e.Out = max(u.Usage.Completion, u.Usage.Output)
	}
	return e
}

// write writes a's output and error files from its journal (SPEC X2):
// the lines in input order; a batch whose window ended adds each line
// that never ran as batch_expired. Idempotent: the files' ids follow from
// the batch's, so writing again after a crash replaces them.
func (m *Manager) write(a *active, lines []line) error {
	rec := a.snapshot()
	j := a.j.Load()
	if err := j.Sync(); err != nil {
		return err
	}
	reread, entries, err := m.o.Store.OpenJournal(rec.ID) // a second reader of the same file
	if err != nil {
		return err
	}
	reread.Close()
	if rec.Goal == Expired {
		for _, l := range lines {
			if l.err == "" && !j.Done(l.no) {
				entries = append(entries, Entry{Line: l.no, Record: errorRecord(rec.ID, l, "batch_expired",
					"This request could not be executed before the completion window expired.")})
			}
		}
	}
	slices.SortFunc(entries, func(a, b Entry) int { return a.Line - b.Line })
	var out, errs bytes.Buffer
	var n Counts
	var use Usage
	for _, e := range entries {
		dst := &errs
		if e.OK {
			dst = &out
			n.Completed++
		} else {
			n.Failed++
		}
		use.Input += e.In
		use.Output += e.Out
		dst.Write(e.Record)
		dst.WriteByte('\n')
	}
	suffix := strings.TrimPrefix(rec.ID, "batch_")
	var outID, errID string
	if out.Len() > 0 {
		outID = "file-" + strings.ToUpper(suffix) + "-output"
		if _, err := m.o.Store.PutOutput(outID, rec.Owner, rec.ID+"_output.jsonl", out.Bytes(), int(n.Completed)); err != nil {
			return err
		}
	}
	if errs.Len() > 0 {
		errID = "file-" + strings.ToUpper(suffix) + "-errors"
		if _, err := m.o.Store.PutOutput(errID, rec.Owner, rec.ID+"_errors.jsonl", errs.Bytes(), int(n.Failed)); err != nil {
			return err
		}
	}
	a.mu.Lock()
	a.rec.OutputFileID, a.rec.ErrorFileID = outID, errID
	a.rec.Counts.Completed, a.rec.Counts.Failed, a.rec.Usage = n.Completed, n.Failed, use
	a.mu.Unlock()
	return nil
}
