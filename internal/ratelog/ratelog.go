// Package ratelog bounds the log lines one kind of event writes, for events
// a peer can cause at will (a refused TLS handshake, a refused request): at
// most Burst lines per Window, and the next line written says how many were
// suppressed in between, so a flood costs a few lines a second and loses no
// count.
//
// It owns the decision only: it never reads a clock (Allow takes the time),
// never writes a line itself and starts no goroutine. A Limiter is safe for
// concurrent use.
package ratelog

import (
	"sync"
	"time"
)

// Defaults for a zero Limiter's fields.
const (
	DefaultBurst  = 10
	DefaultWindow = time.Second
)

// Limiter admits at most Burst lines per Window (fixed windows that start
// at the first line after the previous one ended).
type Limiter struct {
	Burst  int           // ≤ 0: DefaultBurst
	Window time.Duration // ≤ 0: DefaultWindow

	mu         sync.Mutex
	start      time.Time // of the current window; zero before the first line
	n          int       // lines allowed in the current window
	suppressed int64     // lines refused since the last one allowed
}

// Allow reports whether a line may be written at now; when it may,
// suppressed is the number of lines refused since the previous line
// written (log it with the line, e.g. as "suppressed"), and the count
// starts again from zero.
func (l *Limiter) Allow(now time.Time) (ok bool, suppressed int64) {
	burst, window := l.Burst, l.Window
	if burst <= 0 {
		burst = DefaultBurst
	}
	if window <= 0 {
		window = DefaultWindow
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.start.IsZero() || now.Sub(l.start) >= window || now.Before(l.start) {
		l.start, l.n = now, 0
	}
	if l.n >= burst {
		l.suppressed++
		return false, 0
	}
	l.n++
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}
