package outlier

import (
	"time"

	"iop/internal/edge/pool"
)

// Reason is why a provider failed a request before the first byte. The
// values are bounded metric labels.
type Reason uint8

const (
	// ReasonConnect: no connection to the backend could be opened.
	ReasonConnect Reason = iota
	// ReasonReset: the connection closed or broke before the response head.
	ReasonReset
	// ReasonStatus: the upstream answered one of the configured 5xx statuses.
	ReasonStatus
	// ReasonRateLimited: the upstream answered 429.
	ReasonRateLimited
	nReasons
)

var reasonNames = [nReasons]string{"connect", "reset", "status", "rate_limited"}

func (r Reason) String() string {
	if r < nReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Policy is the cooling-down rule (config outlier_detection). A failure
// ejects the provider for Base × 2^(consecutive failures before it), at
// most Max; a 429 with a Retry-After for that long instead (at most Max).
// Disabled: failures eject nothing.
type Policy struct {
	Base, Max time.Duration
	Disabled  bool
}

// entry is one provider's passive-health state. A provider with no entry
// is live with no failure on record.
type entry struct {
	level   int // consecutive ejections; the next window is Base << level
	cooling bool
	until   time.Time // end of the window while cooling
	reason  Reason    // of the ejection that started the window
	// suspected: a failure the input may have caused is on record since
	// the provider's last success, from principal suspect (Suspect).
	suspected bool
	suspect   string
}

// Machine is the passive-health state machine (outlier ejection) of every
// provider: pure — no I/O, no clock, no locks, no goroutines; time arrives
// in each call. Its transitions return at most one Effect for the wrapper
// to carry out. Not safe for concurrent use.
type Machine struct {
	p       Policy
	entries map[pool.Key]*entry
}

// NewMachine returns a Machine with policy p and no provider on record.
func NewMachine(p Policy) *Machine {
	return &Machine{p: p, entries: map[pool.Key]*entry{}}
}

// SetPolicy replaces the policy; windows already running keep their end.
func (m *Machine) SetPolicy(p Policy) { m.p = p }

// Len is the number of providers on record (cooling or with a failure
// streak): zero means Success has nothing to do.
func (m *Machine) Len() int { return len(m.entries) }

// Op is what an Effect asks of the wrapper.
type Op uint8

const (
	// OpNone: nothing to do.
	OpNone Op = iota
	// OpEject: exclude Key from candidates until Until (a new window; log
	// it, count it) and arm the re-admission timer for Until.
	OpEject
	// OpExtend: the running window now ends at Until (a 429 asked for
	// longer); update the pool's projection and re-arm the timer.
	OpExtend
	// OpReadmit: the window ended; Key is a candidate again (log it).
	OpReadmit
	// OpRearm: a timer fired before the window's end; arm it for Until.
	OpRearm
)

// Effect is one transition's output.
type Effect struct {
	Op     Op
	Key    pool.Key
	Until  time.Time
	Reason Reason
	// Level is the number of consecutive ejections, this one included
	// (OpEject).
	Level int
}

// Failure records that k failed a request for reason r at now;
// retryAfter is a 429's Retry-After (0 = none). A provider not cooling is
// ejected: for retryAfter when r is ReasonRateLimited and retryAfter > 0,
// else for Base doubled per consecutive ejection before this one; both at
// most Max. A provider already cooling is not ejected again — the failure
// belongs to a request that started before the window — except that a
// 429 asking for longer extends the window.
func (m *Machine) Failure(k pool.Key, r Reason, retryAfter time.Duration, now time.Time) Effect {
	if m.p.Disabled {
		return Effect{}
	}
	e := m.entries[k]
	if e == nil {
		e = &entry{}
		m.entries[k] = e
	}
	if e.cooling {
		if r == ReasonRateLimited && retryAfter > 0 {
			if until := now.Add(min(retryAfter, m.p.Max)); until.After(e.until) {
				e.until = until
				return Effect{Op: OpExtend, Key: k, Until: until, Reason: e.reason, Level: e.level}
			}
		}
		return Effect{}
	}
	d := m.window(e.level)
	if r == ReasonRateLimited && retryAfter > 0 {
		d = min(retryAfter, m.p.Max)
	}
	e.level++
	e.cooling, e.until, e.reason = true, now.Add(d), r
	e.suspected, e.suspect = false, ""
	return Effect{Op: OpEject, Key: k, Until: e.until, Reason: r, Level: e.level}
}

// Suspect records that k failed a request of principal for reason r at
// now in a way the request's own input may have caused (a reset before
// the response head, a 500 or 504: the HTTP layer decides, see
// docs/operating.md "Passive health"). One principal's input is no
// evidence that a shared provider is sick: k is ejected (as by Failure)
// only when its failures since its last success hold suspicions of two
// different principals; a first suspicion, or more of the same principal,
// only go on record. principal is "" for every request in open mode, so
// there a suspicion never ejects alone. A provider already cooling is left
// as it is.
func (m *Machine) Suspect(k pool.Key, r Reason, principal string, now time.Time) Effect {
	if m.p.Disabled {
		return Effect{}
	}
	e := m.entries[k]
	if e == nil {
		e = &entry{}
		m.entries[k] = e
	}
	switch {
	case e.cooling:
		return Effect{}
	case !e.suspected:
		e.suspected, e.suspect = true, principal
		return Effect{}
	case e.suspect == principal:
		return Effect{}
	}
	return m.Failure(k, r, 0, now) // corroborated by a second principal
}

// window is Base << level, at most Max, without overflow.
func (m *Machine) window(level int) time.Duration {
	d := max(m.p.Base, time.Millisecond)
	for i := 0; i < level && d < m.p.Max; i++ {
		d *= 2
	}
	return min(d, max(m.p.Max, m.p.Base))
}

// Success records that k answered a request: its failure streak is reset,
// so the next ejection is Base long again, and a suspicion on record is
// dropped. A window already running ends on time; nothing else changes.
func (m *Machine) Success(k pool.Key) {
	e := m.entries[k]
	if e == nil {
		return
	}
	e.level, e.suspected, e.suspect = 0, false, ""
	if !e.cooling {
		delete(m.entries, k)
	}
}

// Expire is k's re-admission timer firing at now: the provider is
// re-admitted when its window has ended (OpReadmit), the timer re-armed
// when it fired early (OpRearm), and nothing happens for a provider not
// cooling (a stale timer).
func (m *Machine) Expire(k pool.Key, now time.Time) Effect {
	e := m.entries[k]
	if e == nil || !e.cooling {
		return Effect{}
	}
	if now.Before(e.until) {
		return Effect{Op: OpRearm, Key: k, Until: e.until, Reason: e.reason, Level: e.level}
	}
	e.cooling = false
	if e.level == 0 {
		delete(m.entries, k)
	}
	return Effect{Op: OpReadmit, Key: k, Reason: e.reason, Level: e.level}
}

// Cooling reports whether k is in a window and until when.
func (m *Machine) Cooling(k pool.Key) (time.Time, bool) {
	if e := m.entries[k]; e != nil && e.cooling {
		return e.until, true
	}
	return time.Time{}, false
}
