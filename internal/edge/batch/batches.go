package batch

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// The batches as the HTTP surface asks for them: Create (its parameters
// checked, the per-key bound), Get, List and Cancel.

// CreateParams are POST /v1/batches' body (OpenAI's BatchNewParams).
type CreateParams struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata"`
}

// ParamError is a bad parameter of a request (400 naming it).
type ParamError struct{ Param, Msg string }

func (e *ParamError) Error() string { return e.Param + ": " + e.Msg }

// ErrTooManyBatches is Create's error for a key with Options.MaxPerKey
// batches that have not ended (HTTP 429).
var ErrTooManyBatches = errors.New("too many batches that have not ended")

// Create makes a batch of owner over its file p.InputFileID (SPEC X2): it
// is validating, and runs at once. A key with Options.MaxPerKey batches
// that have not ended gets ErrTooManyBatches (SPEC X4).
func (m *Manager) Create(owner string, p CreateParams) (*Record, error) {
	if !slices.Contains(Endpoints, p.Endpoint) {
		return nil, &ParamError{"endpoint", fmt.Sprintf("want one of %s, got %q", strings.Join(Endpoints, ", "), trunc(p.Endpoint))}
	}
	if p.CompletionWindow != CompletionWindow {
		return nil, &ParamError{"completion_window", fmt.Sprintf("want %q, got %q", CompletionWindow, trunc(p.CompletionWindow))}
	}
	if len(p.Metadata) > 16 {
		return nil, &ParamError{"metadata", "at most 16 pairs"}
	}
	for k, v := range p.Metadata {
		if len(k) > 64 || len(v) > 512 {
			return nil, &ParamError{"metadata", "keys are at most 64 characters, values at most 512"}
		}
	}
	f, err := m.o.Store.File(owner, p.InputFileID)
	if err != nil {
		return nil, &ParamError{"input_file_id", "no such file: " + trunc(p.InputFileID)}
	}
	if f.Purpose != "batch" {
		return nil, &ParamError{"input_file_id", fmt.Sprintf("the file's purpose is %q; a batch's input must be uploaded with purpose \"batch\"", f.Purpose)}
	}
	m.createMu.Lock()
	defer m.createMu.Unlock()
	if m.o.MaxPerKey > 0 {
		if n := m.liveOf(owner); n >= m.o.MaxPerKey {
			return nil, fmt.Errorf("%w: this key has %d (batches.max_batches_per_key %d); wait for one to end or cancel one", ErrTooManyBatches, n, m.o.MaxPerKey)
		}
	}
	now := m.o.Now()
	r := Record{Machine: Machine{Status: Validating}, ID: NewBatchID(), Owner: owner, Endpoint: p.Endpoint,
		InputFileID: f.ID, CompletionWindow: p.CompletionWindow, Metadata: p.Metadata,
		CreatedAt: now.Unix(), ExpiresAt: now.Add(window).Unix(), Counts: Counts{Total: int64(f.Lines)}}
	if err := m.o.Store.PutBatch(&r); err != nil {
		return nil, err
	}
	m.launch(r)
	return &r, nil
}

// liveOf counts owner's batches that have not ended.
func (m *Manager) liveOf(owner string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, a := range m.live {
		if a.owner == owner {
			n++
		}
	}
	return n
}

// ended returns a channel closed when batch id's driver returned (nil
// when it runs none).
func (m *Manager) ended(id string) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a := m.live[id]; a != nil {
		return a.ended
	}
	return nil
}

// Get returns owner's batch id with its counts so far.
func (m *Manager) Get(owner, id string) (*Record, error) {
	m.mu.Lock()
	a := m.live[id]
	m.mu.Unlock()
	if a != nil {
		r := a.snapshot()
		if r.Owner != owner {
			return nil, ErrNotFound
		}
		return &r, nil
	}
	return m.o.Store.Batch(owner, id)
}

// List returns owner's batches, newest first.
func (m *Manager) List(owner, after string, limit int) ([]Record, bool) {
	list, more := m.o.Store.Batches(owner, after, limit)
	for i := range list {
		m.mu.Lock()
		a := m.live[list[i].ID]
		m.mu.Unlock()
		if a != nil {
			list[i] = a.snapshot()
		}
	}
	return list, more
}

// Cancel cancels owner's batch id (SPEC X2): it is cancelling, its lines
// in flight are stopped, and it is cancelled once its files are written.
func (m *Manager) Cancel(owner, id string) (*Record, error) {
	m.mu.Lock()
	a := m.live[id]
	m.mu.Unlock()
	if a == nil {
		r, err := m.o.Store.Batch(owner, id)
		if err != nil {
			return nil, err
		}
		if _, _, err := r.Machine.Step(EvCancel); err != nil {
			return nil, err
		}
		return r, nil
	}
	if a.snapshot().Owner != owner {
		return nil, ErrNotFound
	}
	if err := m.step(a, EvCancel, nil); err != nil {
		return nil, err
	}
	r := a.snapshot()
	return &r, nil
}
