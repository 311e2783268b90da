package batch

import "fmt"

// Status is a batch's status, as OpenAI's Batch object names it (API
// reference, "The batch object": status).
type Status string

// The statuses (SPEC X2). validating, in_progress, finalizing and
// cancelling are live; the other four are terminal.
const (
	Validating Status = "validating"
	InProgress Status = "in_progress"
	Finalizing Status = "finalizing"
	Completed  Status = "completed"
	Failed     Status = "failed"
	Cancelling Status = "cancelling"
	Cancelled  Status = "cancelled"
	Expired    Status = "expired"
)

// Terminal reports whether s is final: nothing runs and the record never
// changes again.
func (s Status) Terminal() bool {
	switch s {
	case Completed, Failed, Cancelled, Expired:
		return true
	}
	return false
}

// Event is what happened to a batch, fed to Machine.Step.
type Event uint8

const (
	// EvValidated: the input file was read; every line is either runnable
	// or answered in the error file (a malformed line).
	EvValidated Event = iota
	// EvInvalid: the input file cannot run at all (missing, over
	// batches.max_lines, no line): the batch fails, with its errors.
	EvInvalid
	// EvAnswered: every line has its answer in the journal.
	EvAnswered
	// EvCancel: POST /v1/batches/{id}/cancel.
	EvCancel
	// EvRevoked: the batch's key was revoked, expired or removed.
	EvRevoked
	// EvExpired: the completion window ended before every line ran.
	EvExpired
	// EvDrained: no line of the batch is in flight any more.
	EvDrained
	// EvWritten: the output and error files are written.
	EvWritten
)

var eventNames = [...]string{"validated", "invalid", "answered", "cancel", "revoked", "expired", "drained", "written"}

func (e Event) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("event(%d)", e)
}

// Effects are what the driver does after a step, in this order: Persist
// the record, Stop the lines in flight (their answers are not journaled),
// Run the lines not yet answered, Write the output and error files.
type Effects uint8

const (
	Persist Effects = 1 << iota
	Stop
	Run
	Write
)

// Machine is one batch's state, pure: Step decides, the driver (run.go)
// carries out the effects and feeds back their events. Status is what the
// API shows; Goal is the terminal status finalizing or cancelling ends in
// (Completed, Cancelled or Expired; "" before either).
type Machine struct {
	Status Status `json:"status"`
	Goal   Status `json:"goal,omitempty"`
}

// ErrNotCancellable is Step's error for a cancel of a batch that already
// ended (409).
type ErrNotCancellable struct{ Status Status }

func (e *ErrNotCancellable) Error() string {
	return fmt.Sprintf("the batch is %s: only a validating or in_progress batch can be cancelled", e.Status)
}

// Step applies ev to m (SPEC X2) and returns the new state and the effects
// to carry out. An event that does not apply in m's status changes nothing
// and has no effect (a late EvDrained, a second cancel, a revocation of a
// batch that is writing its files); a cancel of a terminal batch is an
// *ErrNotCancellable.
//
//	validating  --validated-->  in_progress (Persist, Run)
//	validating  --invalid---->  failed (Persist)
//	in_progress --answered--->  finalizing, goal completed (Persist, Write)
//	validating, in_progress --cancel, revoked--> cancelling, goal cancelled (Persist, Stop)
//	validating, in_progress --expired--> finalizing, goal expired (Persist, Stop)
//	cancelling, finalizing with lines stopped --drained--> (Write)
//	finalizing, cancelling --written--> goal (Persist)
func (m Machine) Step(ev Event) (Machine, Effects, error) {
	live := m.Status == Validating || m.Status == InProgress
	switch ev {
	case EvValidated:
		if m.Status == Validating {
			return Machine{Status: InProgress}, Persist | Run, nil
		}
	case EvInvalid:
		if m.Status == Validating {
			return Machine{Status: Failed}, Persist, nil
		}
	case EvAnswered:
		if m.Status == InProgress {
			return Machine{Status: Finalizing, Goal: Completed}, Persist | Write, nil
		}
	case EvCancel:
		if m.Status.Terminal() {
			return m, 0, &ErrNotCancellable{Status: m.Status}
		}
		fallthrough
	case EvRevoked:
		if live {
			return Machine{Status: Cancelling, Goal: Cancelled}, Persist | Stop, nil
		}
	case EvExpired:
		if live {
			return Machine{Status: Finalizing, Goal: Expired}, Persist | Stop, nil
		}
	case EvDrained:
		if m.Status == Cancelling || m.Status == Finalizing && m.Goal == Expired {
			return m, Write, nil
		}
	case EvWritten:
		if m.Status == Cancelling || m.Status == Finalizing {
			return Machine{Status: m.Goal}, Persist, nil
		}
	}
	return m, 0, nil
}

// Resume is what a batch found in m's status at start does first (SPEC
// X3): validate again (validating: the journal keeps the malformed lines
// already answered), run the lines not answered (in_progress), write the
// files again (finalizing, cancelling: writing is idempotent), nothing
// (terminal).
func (m Machine) Resume() Effects {
	switch m.Status {
	case Validating:
		return 0 // the driver validates
	case InProgress:
		return Run
	case Finalizing, Cancelling:
		return Write
	}
	return 0
}
