package batch

import (
	"errors"
	"testing"
)

// TestX2BatchMachine walks every status through every event: the
// statuses and transitions of OpenAI's batch object, nothing changed by an
// event that does not apply, a cancel of an ended batch refused.
func TestX2BatchMachine(t *testing.T) {
	type state = Machine
	var (
		validating  = state{Status: Validating}
		inProgress  = state{Status: InProgress}
		finalizing  = state{Status: Finalizing, Goal: Completed}
		expiring    = state{Status: Finalizing, Goal: Expired}
		cancelling  = state{Status: Cancelling, Goal: Cancelled}
		completed   = state{Status: Completed}
		failed      = state{Status: Failed}
		cancelled   = state{Status: Cancelled}
		expired     = state{Status: Expired}
		allStatuses = []state{validating, inProgress, finalizing, expiring, cancelling, completed, failed, cancelled, expired}
	)
	type row struct {
		name string
		from state
		ev   Event
		to   state
		eff  Effects
		err  bool
	}
	rows := []row{
		{"X2 validated starts the lines", validating, EvValidated, inProgress, Persist | Run, false},
		{"X2 an invalid file fails the batch", validating, EvInvalid, failed, Persist, false},
		{"X2 every line answered finalizes", inProgress, EvAnswered, finalizing, Persist | Write, false},
		{"X2 cancel while validating", validating, EvCancel, cancelling, Persist | Stop, false},
		{"X2 cancel while running stops the lines", inProgress, EvCancel, cancelling, Persist | Stop, false},
		{"X4 a revoked key stops the lines", inProgress, EvRevoked, cancelling, Persist | Stop, false},
		{"X4 a revoked key while validating", validating, EvRevoked, cancelling, Persist | Stop, false},
		{"X2 the window ends while running", inProgress, EvExpired, expiring, Persist | Stop, false},
		{"X2 the window ends while validating", validating, EvExpired, expiring, Persist | Stop, false},
		{"X2 cancelling drained writes", cancelling, EvDrained, cancelling, Write, false},
		{"X2 expiring drained writes", expiring, EvDrained, expiring, Write, false},
		{"X2 finalizing written completes", finalizing, EvWritten, completed, Persist, false},
		{"X2 expiring written expires", expiring, EvWritten, expired, Persist, false},
		{"X2 cancelling written cancels", cancelling, EvWritten, cancelled, Persist, false},
		{"X2 a second cancel changes nothing", cancelling, EvCancel, cancelling, 0, false},
		{"X2 cancel while finalizing changes nothing", finalizing, EvCancel, finalizing, 0, false},
		{"X4 revoked while writing changes nothing", finalizing, EvRevoked, finalizing, 0, false},
		{"X2 a completed batch is not cancellable", completed, EvCancel, completed, 0, true},
		{"X2 a failed batch is not cancellable", failed, EvCancel, failed, 0, true},
		{"X2 a cancelled batch is not cancellable", cancelled, EvCancel, cancelled, 0, true},
		{"X2 an expired batch is not cancellable", expired, EvCancel, expired, 0, true},
		{"X2 a completing batch does not wait for drained", finalizing, EvDrained, finalizing, 0, false},
	}
	// Every other (status, event) pair changes nothing.
	seen := map[[2]any]bool{}
	for _, r := range rows {
		seen[[2]any{r.from, r.ev}] = true
	}
	for _, s := range allStatuses {
		for ev := EvValidated; ev <= EvWritten; ev++ {
			if !seen[[2]any{s, ev}] {
				rows = append(rows, row{"X2 " + string(s.Status) + "/" + string(s.Goal) + " ignores " + ev.String(), s, ev, s, 0, false})
			}
		}
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			to, eff, err := r.from.Step(r.ev)
			var nc *ErrNotCancellable
			if r.err != errors.As(err, &nc) || (err != nil && !r.err) {
				t.Fatalf("err = %v, want error %v", err, r.err)
			}
			if to != r.to || eff != r.eff {
				t.Fatalf("%+v --%s--> %+v effects %b, want %+v effects %b", r.from, r.ev, to, eff, r.to, r.eff)
			}
			if to.Status.Terminal() && to.Goal != "" {
				t.Fatalf("terminal %s keeps goal %s", to.Status, to.Goal)
			}
		})
	}
}

// TestX3Resume: what a batch found at start does first.
func TestX3Resume(t *testing.T) {
	for _, r := range []struct {
		m    Machine
		want Effects
	}{
		{Machine{Status: Validating}, 0},
		{Machine{Status: InProgress}, Run},
		{Machine{Status: Finalizing, Goal: Completed}, Write},
		{Machine{Status: Finalizing, Goal: Expired}, Write},
		{Machine{Status: Cancelling, Goal: Cancelled}, Write},
		{Machine{Status: Completed}, 0},
		{Machine{Status: Failed}, 0},
		{Machine{Status: Cancelled}, 0},
		{Machine{Status: Expired}, 0},
	} {
		if got := r.m.Resume(); got != r.want {
			t.Errorf("%+v.Resume() = %b, want %b", r.m, got, r.want)
		}
	}
}
