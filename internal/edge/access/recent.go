package access

import (
	"sync"
	"time"
)

// DefaultRecentErrors is how many failed requests Recent keeps.
const DefaultRecentErrors = 20

// RecentError is one failed request as the operator page shows it.
type RecentError struct {
	Time      time.Time `json:"time"`
	RequestID string    `json:"request_id"`
	Model     string    `json:"model"`
	Node      string    `json:"node,omitempty"`
	Provider  string    `json:"provider,omitempty"`
	Status    int       `json:"status"`
	Outcome   Outcome   `json:"outcome"`
	Code      string    `json:"code,omitempty"`
	Error     string    `json:"error,omitempty"`
}

// Recent keeps the last failed requests (every outcome but OK and
// ClientCancelled), newest first, in a ring of fixed size. Safe for
// concurrent use; the zero value keeps DefaultRecentErrors.
type Recent struct {
	mu   sync.Mutex
	size int
	ring []RecentError
	next int // index of the slot the next Add writes
	n    int // entries held
}

// NewRecent returns a Recent keeping size entries (<1 means
// DefaultRecentErrors).
func NewRecent(size int) *Recent {
	if size < 1 {
		size = DefaultRecentErrors
	}
	return &Recent{size: size}
}

// Add keeps r when it failed; end is when it ended.
func (rc *Recent) Add(r *Record, end time.Time) {
	if r.Outcome == OK || r.Outcome == ClientCancelled || r.Outcome == "" {
		return
	}
	e := RecentError{Time: end, RequestID: r.RequestID, Model: r.Model, Node: r.Node, Provider: r.Provider,
		Status: r.Status, Outcome: r.Outcome, Code: r.Code, Error: r.Error}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.size == 0 {
		rc.size = DefaultRecentErrors
	}
	if rc.ring == nil {
		rc.ring = make([]RecentError, rc.size)
	}
	rc.ring[rc.next] = e
	rc.next = (rc.next + 1) % rc.size
	rc.n = min(rc.n+1, rc.size)
}

// List returns the kept entries, newest first; the caller owns the slice.
func (rc *Recent) List() []RecentError {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make([]RecentError, 0, rc.n)
	for i := 1; i <= rc.n; i++ {
		out = append(out, rc.ring[(rc.next-i+rc.size)%rc.size])
	}
	return out
}
