package managed

import (
	"bytes"
	"slices"
	"strings"
	"sync"
)

// DefaultLogBytes is how much of a process's stdout and stderr a Backend
// keeps per model (the last 64 KiB; SPEC U5).
const DefaultLogBytes = 64 << 10

// ring keeps the last size bytes written to it; safe for concurrent use
// (a process's stdout and stderr share one).
type ring struct {
	mu   sync.Mutex
	buf  []byte
	size int
	full bool // bytes were dropped
}

func newRing(size int) *ring { return &ring{size: size} }

// Write keeps p's last bytes; it never fails and never blocks the process.
func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	if len(p) >= r.size {
		r.buf = append(r.buf[:0], p[len(p)-r.size:]...)
		r.full = true
		return n, nil
	}
	if over := len(r.buf) + len(p) - r.size; over > 0 {
		r.buf = append(r.buf[:0], r.buf[over:]...)
		r.full = true
	}
	r.buf = append(r.buf, p...)
	return n, nil
}

// Bytes is a copy of what the ring holds.
func (r *ring) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.buf)
}

// LastLines is the last n non-empty lines written, joined by " | ", at
// most 1024 bytes (the end kept): what a process said as it failed, whose
// very last line is often a cleanup message (llama-server: "cleaning up
// before exit..." after the error).
func (r *ring) LastLines(n int) string {
	b := bytes.TrimRight(r.Bytes(), "\r\n ")
	var lines []string
	for len(b) > 0 && len(lines) < n {
		i := bytes.LastIndexByte(b, '\n')
		if l := string(bytes.TrimRight(b[i+1:], "\r ")); l != "" {
			lines = append(lines, l)
		}
		if i < 0 {
			break
		}
		b = b[:i]
	}
	slices.Reverse(lines)
	s := strings.Join(lines, " | ")
	if len(s) > 1024 {
		s = s[len(s)-1024:]
	}
	return s
}

// LastLine is the last non-empty line written, at most 512 bytes of it
// (for an error message).
func (r *ring) LastLine() string {
	b := bytes.TrimRight(r.Bytes(), "\r\n ")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	if len(b) > 512 {
		b = b[len(b)-512:]
	}
	return string(b)
}
