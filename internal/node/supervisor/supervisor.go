// Package supervisor owns the Node's connectivity policy (SPEC S1–S5): per
// edge, one goroutine does the initial dial and every reconnect, serially,
// and decides after each failure whether to wait and retry, give up, or
// stop at once (Run for one edge; RunEdges for several, which shares only
// which edge is ready and which gave up).
//
// The decision is the pure function Decide (no I/O, no clock); Run executes it
// around a caller-supplied connect function. The package never dials, never
// reads files and never exits the process: main maps Run's result to an exit
// code (SPEC S4: nil → 0, error → 1), so correctness never depends on a
// service manager restarting the Node (SPEC S5).
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Errors returned by Run; test with errors.Is.
var (
	// ErrExhausted: the finite reconnect.max_attempts limit was reached by
	// consecutive failed attempts (SPEC S2). Run's error wraps it and the last
	// attempt's error.
	ErrExhausted = errors.New("supervisor: reconnect attempts exhausted")
	// ErrFatal: a local configuration or credential error that no retry can
	// fix (SPEC S3). Build one with MarkFatal; Run's error wraps it and the
	// cause.
	ErrFatal = errors.New("supervisor: fatal local error")
	// ErrGiveUp: the edge said retrying cannot succeed until its operator
	// changes its config (SPEC N6). Build one with MarkGiveUp; the
	// supervisor gives that edge up at once, as if its attempts were used
	// up (RunEdges: the node goes on serving its other edges).
	ErrGiveUp = errors.New("supervisor: retrying this edge cannot succeed")
)

// ErrKind classifies a failed attempt (SPEC S3).
type ErrKind int

const (
	// KindRemote: dial, TLS handshake, rejected registration, ready=false or
	// loss of an established session. Retried.
	KindRemote ErrKind = iota + 1
	// KindFatal: unreadable certificate or key, invalid local config. Never
	// retried.
	KindFatal
	// KindGiveUp: the edge says retrying cannot help (SPEC N6): that edge
	// is given up.
	KindGiveUp
)

func (k ErrKind) String() string {
	switch k {
	case KindRemote:
		return "remote"
	case KindFatal:
		return "fatal"
	case KindGiveUp:
		return "give up"
	default:
		return fmt.Sprintf("ErrKind(%d)", int(k))
	}
}

// Action is what the supervisor does after a failed attempt.
type Action int

const (
	// Retry: wait Decision.Wait, then dial again.
	Retry Action = iota + 1
	// GiveUp: the finite attempt limit is reached; Run returns ErrExhausted.
	GiveUp
	// Fatal: stop at once; Run returns the cause wrapped in ErrFatal.
	Fatal
)

func (a Action) String() string {
	switch a {
	case Retry:
		return "retry"
	case GiveUp:
		return "give up"
	case Fatal:
		return "fatal"
	default:
		return fmt.Sprintf("Action(%d)", int(a))
	}
}

// Policy is the one dial/reconnect policy (SPEC S2), usually built from
// config.Config.Interval() and MaxAttempts().
type Policy struct {
	// Interval between the end of a failed attempt and the next dial.
	Interval time.Duration
	// MaxAttempts is the number of consecutive failed attempts after which
	// the supervisor gives up; 0 = unlimited until local shutdown.
	MaxAttempts int
}

// Decision is the outcome of Decide.
type Decision struct {
	Action Action
	// Wait before the next dial; set only when Action is Retry.
	Wait time.Duration
}

// Decide is the pure supervision policy (SPEC S2, S3). failed is the number
// of consecutive failed attempts including the one just ended; 0 means the
// attempt reached ready and the session ended later, which is a success that
// resets the count (a finite limit counts only failures after it). kind
// classifies how the attempt ended.
//
//   - KindFatal → Fatal, whatever the count.
//   - KindGiveUp → GiveUp, whatever the count.
//   - KindRemote with p.MaxAttempts > 0 and failed ≥ p.MaxAttempts → GiveUp.
//   - KindRemote otherwise → Retry after p.Interval (negative counts as 0).
//
// Even a ready session that ended is followed by one Interval before the
// next dial, so an edge that accepts and drops at once cannot drive a tight
// reconnect loop.
func Decide(failed int, kind ErrKind, p Policy) Decision {
	if kind == KindFatal {
		return Decision{Action: Fatal}
	}
	if kind == KindGiveUp {
		return Decision{Action: GiveUp}
	}
	if p.MaxAttempts > 0 && failed >= p.MaxAttempts {
		return Decision{Action: GiveUp}
	}
	return Decision{Action: Retry, Wait: max(p.Interval, 0)}
}

// FatalError marks a local error as fatal (SPEC S3). It wraps ErrFatal and
// the cause.
type FatalError struct{ Err error }

func (e *FatalError) Error() string { return "fatal local error: " + e.Err.Error() }

// Unwrap returns ErrFatal and the cause.
func (e *FatalError) Unwrap() []error { return []error{ErrFatal, e.Err} }

// MarkFatal wraps err so that Run stops at once instead of retrying. A nil err
// stays nil.
func MarkFatal(err error) error {
	if err == nil {
		return nil
	}
	return &FatalError{Err: err}
}

// GiveUpError marks an edge's refusal that no retry can change (SPEC
// N6). It wraps ErrGiveUp and the cause.
type GiveUpError struct{ Err error }

func (e *GiveUpError) Error() string { return "retrying cannot help: " + e.Err.Error() }

// Unwrap returns ErrGiveUp and the cause.
func (e *GiveUpError) Unwrap() []error { return []error{ErrGiveUp, e.Err} }

// MarkGiveUp wraps err so that the supervisor gives its edge up at once.
// A nil err stays nil.
func MarkGiveUp(err error) error {
	if err == nil {
		return nil
	}
	return &GiveUpError{Err: err}
}

// KindOf classifies err: KindFatal when it wraps ErrFatal, KindGiveUp
// when it wraps ErrGiveUp, KindRemote otherwise (including nil, which a
// connect function returns for a session that ended cleanly from the
// edge's side).
func KindOf(err error) ErrKind {
	switch {
	case errors.Is(err, ErrFatal):
		return KindFatal
	case errors.Is(err, ErrGiveUp):
		return KindGiveUp
	}
	return KindRemote
}

// ConnectFunc runs one attempt: dial, handshake, register, ready and, when it
// got there, the whole live session. It returns when the attempt or the
// session ends, or promptly after ctx is done. reachedReady reports whether
// the Edge acknowledged ready=true (SPEC L5); err says why it ended (wrap
// local credential or config errors with MarkFatal).
type ConnectFunc func(ctx context.Context) (reachedReady bool, err error)

// Run is the Node's single supervisor (SPEC S1): on the calling goroutine it
// calls connect for the initial dial and for every reconnect, serially,
// applying Decide after each end. It returns
//   - nil when ctx is done (SIGINT/SIGTERM, SPEC S4), promptly even in the
//     middle of a backoff wait;
//   - an error wrapping ErrExhausted and the last attempt's error after
//     p.MaxAttempts consecutive failed attempts;
//   - an error wrapping ErrFatal and the cause for a fatal attempt.
//
// log may be nil.
func Run(ctx context.Context, p Policy, connect ConnectFunc, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	failed := 0
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil {
			return nil
		}
		ready, err := connect(ctx)
		if ctx.Err() != nil {
			log.Info("supervisor stopped by local shutdown")
			return nil
		}
		if ready {
			failed = 0
		} else {
			failed++
		}
		kind := KindOf(err)
		d := Decide(failed, kind, p)
		switch d.Action {
		case Fatal:
			log.Error("supervisor: fatal error, not retrying", "err", err)
			return fmt.Errorf("attempt %d: %w", attempt, err)
		case GiveUp:
			log.Error("supervisor: giving up", "failed_attempts", failed, "err", err)
			return fmt.Errorf("%w: %d consecutive failed attempts, last: %w", ErrExhausted, failed, err)
		}
		if ready {
			log.Warn("session ended, reconnecting", "err", err, "wait", d.Wait)
		} else {
			log.Warn("connect attempt failed, retrying", "attempt", failed, "max_attempts", p.MaxAttempts, "err", err, "wait", d.Wait)
		}
		if !wait(ctx, d.Wait) {
			log.Info("supervisor stopped by local shutdown")
			return nil
		}
	}
}

// wait blocks for d or until ctx is done; it reports whether d elapsed.
func wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
