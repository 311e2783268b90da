package supervisor

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/leakcheck"
)

var errDial = errors.New("dial tcp: connection refused")

// S2, S3: the pure policy.
func TestDecide(t *testing.T) {
	unlimited := Policy{Interval: 10 * time.Second, MaxAttempts: 0}
	ten := Policy{Interval: 10 * time.Second, MaxAttempts: 10}
	two := Policy{Interval: 3 * time.Second, MaxAttempts: 2}
	tests := []struct {
		name   string
		failed int
		kind   ErrKind
		p      Policy
		want   Decision
	}{
		{"S2 omitted max_attempts (10): 1st failure retries", 1, KindRemote, ten, Decision{Retry, 10 * time.Second}},
		{"S2 omitted max_attempts (10): 9th failure retries", 9, KindRemote, ten, Decision{Retry, 10 * time.Second}},
		{"S2 omitted max_attempts (10): 10th failure gives up", 10, KindRemote, ten, Decision{Action: GiveUp}},
		{"S2 max_attempts 0 is unlimited", 1_000_000, KindRemote, unlimited, Decision{Retry, 10 * time.Second}},
		{"S2 positive max_attempts 2: 1st failure retries", 1, KindRemote, two, Decision{Retry, 3 * time.Second}},
		{"S2 positive max_attempts 2: 2nd failure gives up", 2, KindRemote, two, Decision{Action: GiveUp}},
		{"S2 ready resets the count: loss after ready retries even with max 1", 0, KindRemote, Policy{Interval: time.Second, MaxAttempts: 1}, Decision{Retry, time.Second}},
		{"S2 interval 0 in finite mode retries at once", 1, KindRemote, Policy{MaxAttempts: 3}, Decision{Retry, 0}},
		{"S3 fatal at once on the first attempt", 1, KindFatal, ten, Decision{Action: Fatal}},
		{"S3 fatal in unlimited mode", 5, KindFatal, unlimited, Decision{Action: Fatal}},
		{"S3 fatal after ready", 0, KindFatal, unlimited, Decision{Action: Fatal}},
		{"S2 an edge that says retrying cannot help is given up at once", 1, KindGiveUp, unlimited, Decision{Action: GiveUp}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Decide(tc.failed, tc.kind, tc.p); got != tc.want {
				t.Errorf("Decide(%d, %v, %+v) = %+v, want %+v", tc.failed, tc.kind, tc.p, got, tc.want)
			}
		})
	}
}

// S3: classification of connect errors.
func TestKindOf(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want ErrKind
	}{
		{"S3 dial error is remote", errDial, KindRemote},
		{"S3 nil (clean close) is remote", nil, KindRemote},
		{"S3 marked error is fatal", MarkFatal(errors.New("open key.pem: permission denied")), KindFatal},
		{"S3 wrapped marked error is fatal", fmt.Errorf("tls: %w", MarkFatal(errDial)), KindFatal},
		{"S2 an edge's refusal marked give-up", fmt.Errorf("edge: %w", MarkGiveUp(errDial)), KindGiveUp},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := KindOf(tc.err); got != tc.want {
				t.Errorf("KindOf(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
	if MarkFatal(nil) != nil || MarkGiveUp(nil) != nil {
		t.Error("MarkFatal(nil) or MarkGiveUp(nil) != nil")
	}
}

// result is what one scripted attempt returns.
type result struct {
	ready bool
	err   error
}

// S1–S4: Run drives the policy serially; time is synctest's fake clock.
func TestRun(t *testing.T) {
	fatalErr := MarkFatal(errors.New("open node.key: permission denied"))
	tests := []struct {
		name        string
		p           Policy
		script      []result      // attempt i returns script[i]; past the end: errDial
		cancelAfter time.Duration // >0: cancel ctx at this fake time
		wantErr     error         // nil: Run returns nil
		wantDials   int
		wantElapsed time.Duration // fake time at return
	}{
		{
			name:    "S2 max_attempts 2 gives up after exactly 2 dials",
			p:       Policy{Interval: 10 * time.Second, MaxAttempts: 2},
			wantErr: ErrExhausted, wantDials: 2, wantElapsed: 10 * time.Second,
		},
		{
			name:    "S2 omitted max_attempts (10) gives up after exactly 10 dials",
			p:       Policy{Interval: 10 * time.Second, MaxAttempts: 10},
			wantErr: ErrExhausted, wantDials: 10, wantElapsed: 90 * time.Second,
		},
		{
			name:        "S2 max_attempts 0 keeps trying until shutdown",
			p:           Policy{Interval: 10 * time.Second},
			cancelAfter: 1000*time.Second + 5*time.Second,
			wantErr:     nil, wantDials: 101, wantElapsed: 1005 * time.Second,
		},
		{
			name: "S2 ready resets the count",
			p:    Policy{Interval: time.Second, MaxAttempts: 2},
			// fail, ready(lost), fail, ready(lost), fail, fail → give up.
			script:  []result{{false, errDial}, {true, errors.New("session lost")}, {false, errDial}, {true, nil}, {false, errDial}, {false, errDial}},
			wantErr: ErrExhausted, wantDials: 6, wantElapsed: 5 * time.Second,
		},
		{
			name:    "S3 fatal at once without retry",
			p:       Policy{Interval: 10 * time.Second, MaxAttempts: 0},
			script:  []result{{false, fatalErr}},
			wantErr: ErrFatal, wantDials: 1, wantElapsed: 0,
		},
		{
			name:    "S3 fatal after retries stops at once",
			p:       Policy{Interval: 10 * time.Second, MaxAttempts: 5},
			script:  []result{{false, errDial}, {false, fatalErr}},
			wantErr: ErrFatal, wantDials: 2, wantElapsed: 10 * time.Second,
		},
		{
			name:        "S4 shutdown mid-backoff returns nil at once",
			p:           Policy{Interval: 10 * time.Second, MaxAttempts: 3},
			cancelAfter: 4 * time.Second,
			wantErr:     nil, wantDials: 1, wantElapsed: 4 * time.Second,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				if tc.cancelAfter > 0 {
					time.AfterFunc(tc.cancelAfter, cancel)
				}
				start := time.Now()
				dials := 0
				connect := func(ctx context.Context) (bool, error) {
					dials++
					if dials <= len(tc.script) {
						r := tc.script[dials-1]
						return r.ready, r.err
					}
					return false, errDial
				}
				err := Run(ctx, tc.p, connect, nil)
				elapsed := time.Since(start)
				switch {
				case tc.wantErr == nil && err != nil:
					t.Errorf("Run = %v, want nil", err)
				case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
					t.Errorf("Run = %v, want an error wrapping %v", err, tc.wantErr)
				}
				if dials != tc.wantDials {
					t.Errorf("dials = %d, want %d", dials, tc.wantDials)
				}
				if elapsed != tc.wantElapsed {
					t.Errorf("returned after %v, want %v", elapsed, tc.wantElapsed)
				}
			})
		})
	}
}

// S3: the last attempt's cause stays visible through ErrExhausted.
func TestRunExhaustedWrapsLastError(t *testing.T) {
	leakcheck.Check(t)
	synctest.Test(t, func(t *testing.T) {
		err := Run(t.Context(), Policy{Interval: time.Second, MaxAttempts: 1}, func(context.Context) (bool, error) {
			return false, errDial
		}, nil)
		if !errors.Is(err, ErrExhausted) || !errors.Is(err, errDial) {
			t.Errorf("Run = %v, want it to wrap ErrExhausted and the dial error", err)
		}
	})
}

// S4: a connect in progress sees ctx done and Run returns nil, not the
// attempt's error.
func TestRunShutdownDuringAttempt(t *testing.T) {
	leakcheck.Check(t)
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(3*time.Second, cancel)
		err := Run(ctx, Policy{Interval: time.Second, MaxAttempts: 1}, func(ctx context.Context) (bool, error) {
			<-ctx.Done()
			return true, ctx.Err()
		}, nil)
		if err != nil {
			t.Errorf("Run = %v, want nil after shutdown", err)
		}
	})
}
