package proctest

import (
	"errors"
	"os/exec"
	"testing"
	"time"
)

// WaitFor wakes on the write that completes the line, and gives up at its
// deadline when the line never comes.
func TestLogWaitFor(t *testing.T) {
	var l Log
	done := make(chan bool, 1)
	go func() { done <- l.WaitFor("edge serving", 10*time.Second) }()
	l.Write([]byte(`{"msg":"edge `))
	l.Write([]byte(`serving"}` + "\n"))
	if !<-done {
		t.Fatal("WaitFor missed a line split over two writes")
	}
	if l.WaitFor("never", time.Millisecond) {
		t.Fatal("WaitFor found a line never written")
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{{nil, 0}, {errors.New("start failed"), -1}} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
	if got := ExitCode(exec.Command("sh", "-c", "exit 3").Run()); got != 3 {
		t.Errorf("exit 3: got %d", got)
	}
}
