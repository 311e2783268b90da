package batch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// UploadTimeout bounds reading one upload (POST /v1/files), replacing the
// edge's body read timeout for it: 100 MiB at 350 KiB/s.
const UploadTimeout = 5 * time.Minute

// multipartSlack is what a multipart upload may hold besides the file.
const multipartSlack = 1 << 20

// ServeHTTP answers the Files and Batch API for the key the request's
// context carries (Options.Owner; the edge's client handler authenticated
// it): in OpenAI's shapes (API reference, "Files", "Batch"), errors as
// {"error":{"message","type","param","code"}}. Another key's id is a 404,
// the same as an id that never was (SPEC X4).
//
//	POST   /v1/files                 multipart: file, purpose=batch → file object
//	GET    /v1/files                 ?purpose, after, limit (1–10000), order (asc|desc) → list
//	GET    /v1/files/{id}            → file object
//	GET    /v1/files/{id}/content    → the bytes
//	DELETE /v1/files/{id}            → {"id","object":"file","deleted":true}
//	POST   /v1/batches               {"input_file_id","endpoint","completion_window":"24h","metadata"} → batch
//	GET    /v1/batches               ?after, limit (1–100) → list
//	GET    /v1/batches/{id}          → batch
//	POST   /v1/batches/{id}/cancel   → batch (cancelling)
func (m *Manager) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	owner, _ := m.o.Owner(r.Context())
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/"), "/")
	switch {
	case parts[0] == "files" && len(parts) == 1:
		switch r.Method {
		case http.MethodPost:
			m.upload(w, r, owner)
		case http.MethodGet:
			m.listFiles(w, r, owner)
		default:
			notAllowed(w, "GET, POST")
		}
	case parts[0] == "files" && len(parts) == 2 && parts[1] != "":
		switch r.Method {
		case http.MethodGet:
			f, err := m.o.Store.File(owner, parts[1])
			if err != nil {
				fail(w, err, "File", parts[1])
				return
			}
			writeJSON(w, http.StatusOK, fileObject(f))
		case http.MethodDelete:
			if err := m.o.Store.DeleteFile(owner, parts[1]); err != nil {
				fail(w, err, "File", parts[1])
				return
			}
			writeJSON(w, http.StatusOK, map[string]any{"id": parts[1], "object": "file", "deleted": true})
		default:
			notAllowed(w, "GET, DELETE")
		}
	case parts[0] == "files" && len(parts) == 3 && parts[2] == "content":
		if r.Method != http.MethodGet {
			notAllowed(w, "GET")
			return
		}
		c, f, err := m.o.Store.Content(owner, parts[1])
		if err != nil {
			fail(w, err, "File", parts[1])
			return
		}
		defer c.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(f.Bytes, 10))
		w.Header().Set("Content-Disposition", contentDisposition(f.Filename))
		_, _ = io.Copy(w, c)
	case parts[0] == "batches" && len(parts) == 1:
		switch r.Method {
		case http.MethodPost:
			m.create(w, r, owner)
		case http.MethodGet:
			limit, ok := limitParam(w, r, 20, 100)
			if !ok {
				return
			}
			list, more := m.List(owner, r.URL.Query().Get("after"), limit)
			objs := make([]any, len(list))
			for i := range list {
				objs[i] = batchObject(&list[i])
			}
			writeJSON(w, http.StatusOK, listObject(objs, more, func(i int) string { return list[i].ID }))
		default:
			notAllowed(w, "GET, POST")
		}
	case parts[0] == "batches" && len(parts) == 2 && parts[1] != "":
		if r.Method != http.MethodGet {
			notAllowed(w, "GET")
			return
		}
		b, err := m.Get(owner, parts[1])
		if err != nil {
			fail(w, err, "Batch", parts[1])
			return
		}
		writeJSON(w, http.StatusOK, batchObject(b))
	case parts[0] == "batches" && len(parts) == 3 && parts[2] == "cancel":
		if r.Method != http.MethodPost {
			notAllowed(w, "POST")
			return
		}
		b, err := m.Cancel(owner, parts[1])
		if err != nil {
			fail(w, err, "Batch", parts[1])
			return
		}
		writeJSON(w, http.StatusOK, batchObject(b))
	default:
		writeError(w, http.StatusNotFound, "unknown_url", "", "unknown endpoint: "+r.Method+" "+trunc(r.URL.Path))
	}
}

// upload stores the "file" part of a multipart/form-data body; the
// "purpose" part must say "batch" (SPEC X1). The file streams to disk:
// memory stays one buffer whatever its size.
func (m *Manager) upload(w http.ResponseWriter, r *http.Request, owner string) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(UploadTimeout))
	r.Body = http.MaxBytesReader(w, r.Body, m.o.Store.lim.MaxFileBytes+multipartSlack)
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "file", "want a multipart/form-data body with a file part and purpose=batch: "+err.Error())
		return
	}
	var f *File
	purpose := ""
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			m.dropUpload(f, owner)
			uploadError(w, err)
			return
		}
		switch p.FormName() {
		case "purpose":
			b, _ := io.ReadAll(io.LimitReader(p, 64))
			purpose = string(b)
		case "file":
			if f != nil {
				m.dropUpload(f, owner)
				writeError(w, http.StatusBadRequest, "invalid_request", "file", "more than one file part")
				return
			}
			name := p.FileName()
			if name == "" {
				name = "upload.jsonl"
			}
			f, err = m.o.Store.CreateFile(owner, trunc(name), "batch", p)
			if err != nil {
				uploadError(w, err)
				return
			}
		}
		p.Close()
	}
	switch {
	case f == nil:
		writeError(w, http.StatusBadRequest, "invalid_request", "file", "no file part in the upload")
	case purpose != "batch":
		m.dropUpload(f, owner)
		writeError(w, http.StatusBadRequest, "invalid_request", "purpose", fmt.Sprintf("this edge stores files for batches only: want purpose \"batch\", got %q", trunc(purpose)))
	default:
		writeJSON(w, http.StatusOK, fileObject(f))
	}
}

// contentDisposition is the download's header for a file named name (a
// label the uploader chose): only its last path element, either separator,
// without control characters, so that a client saving by it writes no
// other directory; "download.jsonl" when nothing is left.
func contentDisposition(name string) string {
	if i := strings.LastIndexAny(name, `/\`); i >= 0 {
		name = name[i+1:]
	}
	name = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, name)
	if name == "" || name == "." || name == ".." {
		name = "download.jsonl"
	}
	if v := mime.FormatMediaType("attachment", map[string]string{"filename": name}); v != "" {
		return v
	}
	return "attachment"
}

func (m *Manager) dropUpload(f *File, owner string) {
	if f != nil {
		_ = m.o.Store.DeleteFile(owner, f.ID)
	}
}

func uploadError(w http.ResponseWriter, err error) {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe), errors.Is(err, ErrTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "file_too_large", "file", err.Error())
	case errors.Is(err, ErrTooMany):
		writeError(w, http.StatusBadRequest, "too_many_lines", "file", err.Error())
	case errors.Is(err, ErrKeyStorage), errors.Is(err, ErrKeyFiles):
		writeError(w, http.StatusInsufficientStorage, "key_storage_full", "file", err.Error())
	case errors.Is(err, ErrStorage):
		writeError(w, http.StatusInsufficientStorage, "storage_full", "file", err.Error())
	case errors.Is(err, ErrEmptyInput):
		writeError(w, http.StatusBadRequest, "empty_file", "file", "the file is empty; a batch's input has one JSON request a line")
	default:
		writeError(w, http.StatusBadRequest, "invalid_request", "file", "the upload could not be read: "+err.Error())
	}
}

func (m *Manager) listFiles(w http.ResponseWriter, r *http.Request, owner string) {
	q := r.URL.Query()
	limit, ok := limitParam(w, r, 10000, 10000)
	if !ok {
		return
	}
	order := q.Get("order")
	if order != "" && order != "asc" && order != "desc" {
		writeError(w, http.StatusBadRequest, "invalid_request", "order", fmt.Sprintf("want asc or desc, got %q", trunc(order)))
		return
	}
	list, more := m.o.Store.Files(owner, q.Get("purpose"), q.Get("after"), limit, order == "asc")
	objs := make([]any, len(list))
	for i := range list {
		objs[i] = fileObject(&list[i])
	}
	writeJSON(w, http.StatusOK, listObject(objs, more, func(i int) string { return list[i].ID }))
}

func (m *Manager) create(w http.ResponseWriter, r *http.Request, owner string) {
	var p CreateParams
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	if err := dec.Decode(&p); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "", "the body is not a JSON object of input_file_id, endpoint, completion_window and metadata: "+err.Error())
		return
	}
	b, err := m.Create(owner, p)
	if err != nil {
		fail(w, err, "Batch", "")
		return
	}
	writeJSON(w, http.StatusOK, batchObject(b))
}

func limitParam(w http.ResponseWriter, r *http.Request, def, most int) (int, bool) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > most {
		writeError(w, http.StatusBadRequest, "invalid_request", "limit", fmt.Sprintf("want 1 to %d, got %q", most, trunc(v)))
		return 0, false
	}
	return n, true
}

// fail answers err of an operation on the object kind id names.
func fail(w http.ResponseWriter, err error, kind, id string) {
	var pe *ParamError
	var nc *ErrNotCancellable
	switch {
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", "", fmt.Sprintf("No such %s object: %s", kind, trunc(id)))
	case errors.As(err, &pe):
		writeError(w, http.StatusBadRequest, "invalid_request", pe.Param, pe.Error())
	case errors.Is(err, ErrTooManyBatches):
		writeError(w, http.StatusTooManyRequests, "too_many_batches", "", err.Error())
	case errors.As(err, &nc), errors.Is(err, ErrInUse):
		writeError(w, http.StatusConflict, "conflict", "", err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "internal_error", "", "the batch store failed: "+err.Error())
	}
}

func notAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "", "method not allowed; use "+allow)
}

func writeError(w http.ResponseWriter, status int, code, param, msg string) {
	e := map[string]any{"message": msg, "type": "invalid_request_error", "param": nil, "code": code}
	if param != "" {
		e["param"] = param
	}
	if status >= 500 {
		e["type"] = "server_error"
	}
	writeJSON(w, status, map[string]any{"error": e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// fileObject is OpenAI's file object.
func fileObject(f *File) map[string]any {
	return map[string]any{"id": f.ID, "object": "file", "bytes": f.Bytes, "created_at": f.CreatedAt,
		"filename": f.Filename, "purpose": f.Purpose, "status": "processed", "expires_at": nil, "status_details": nil}
}

// listObject is OpenAI's cursor page: {"object":"list","data","first_id","last_id","has_more"}.
func listObject(data []any, more bool, id func(int) string) map[string]any {
	l := map[string]any{"object": "list", "data": data, "has_more": more, "first_id": nil, "last_id": nil}
	if n := len(data); n > 0 {
		l["first_id"], l["last_id"] = id(0), id(n-1)
	}
	return l
}

// batchObject is OpenAI's batch object; a time not reached yet, a file not
// written and no errors are null.
func batchObject(b *Record) map[string]any {
	t := func(v int64) any {
		if v == 0 {
			return nil
		}
		return v
	}
	s := func(v string) any {
		if v == "" {
			return nil
		}
		return v
	}
	o := map[string]any{
		"id": b.ID, "object": "batch", "endpoint": b.Endpoint, "model": s(b.Model),
		"errors": nil, "input_file_id": b.InputFileID, "completion_window": b.CompletionWindow,
		"status": b.Status, "output_file_id": s(b.OutputFileID), "error_file_id": s(b.ErrorFileID),
		"created_at": b.CreatedAt, "in_progress_at": t(b.InProgressAt), "expires_at": t(b.ExpiresAt),
		"finalizing_at": t(b.FinalizingAt), "completed_at": t(b.CompletedAt), "failed_at": t(b.FailedAt),
		"expired_at": t(b.ExpiredAt), "cancelling_at": t(b.CancellingAt), "cancelled_at": t(b.CancelledAt),
		"request_counts": b.Counts, "metadata": b.Metadata,
		"usage": map[string]any{"input_tokens": b.Usage.Input, "input_tokens_details": map[string]int64{"cached_tokens": 0},
			"output_tokens": b.Usage.Output, "output_tokens_details": map[string]int64{"reasoning_tokens": 0},
			"total_tokens": b.Usage.Input + b.Usage.Output},
	}
	if len(b.Errors) > 0 {
		data := make([]map[string]any, len(b.Errors))
		for i, e := range b.Errors {
			d := map[string]any{"code": e.Code, "message": e.Message, "line": nil, "param": nil}
			if e.Line > 0 {
				d["line"] = e.Line
			}
			if e.Param != "" {
				d["param"] = e.Param
			}
			data[i] = d
		}
		o["errors"] = map[string]any{"object": "list", "data": data}
	}
	return o
}
