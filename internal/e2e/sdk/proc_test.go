package sdk

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// stopGrace is how long a process gets to exit after SIGTERM before the
// harness SIGKILLs its process group and reports the overrun.
const stopGrace = 10 * time.Second

// proc is one started binary in its own process group. Its stdout and stderr
// go through one pipe into a logTail; one goroutine pumps the pipe and one
// waits for the process (both end when the process group is gone).
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *logTail
	done chan struct{} // closed when Wait has returned
	out  chan struct{} // closed when every line of its output is in log
	code int           // exit code (-1 when killed by a signal); valid after done
}

// startProc starts bin with args in a new process group. Pdeathsig kills the
// child if the test binary dies first (e.g. a go test timeout panic). The
// pump goroutine ends at EOF, i.e. when the child (the only holder of the
// pipe's write end) is gone; the wait goroutine when it has been reaped.
func startProc(name, bin string, args ...string) (*proc, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: pipe: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.Env = os.Environ()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	pw.Close() // the child holds the only write end now: EOF when it is gone
	p := &proc{name: name, cmd: cmd, log: newLogTail(), done: make(chan struct{}), out: make(chan struct{})}
	go func() {
		p.log.pump(pr)
		pr.Close()
		close(p.out)
	}()
	go func() {
		cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	return p, nil
}

// signal sends sig to the whole process group.
func (p *proc) signal(sig syscall.Signal) error {
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %s %v: %w", p.name, sig, err)
	}
	return nil
}

// exited reports whether the process has been reaped.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits up to d for the process to exit and for its last output line
// to reach log (the pump reads the pipe on its own goroutine, possibly after
// the exit was reaped), and returns its exit code.
func (p *proc) wait(d time.Duration) (int, error) {
	timeout := time.After(d)
	select {
	case <-p.done:
	case <-timeout:
		return 0, fmt.Errorf("%s still running after %v", p.name, d)
	}
	select {
	case <-p.out:
		return p.code, nil
	case <-timeout:
		return 0, fmt.Errorf("%s exited, but its output did not end within %v", p.name, d)
	}
}

// stop sends SIGTERM and waits stopGrace; on overrun it SIGKILLs the group and
// returns an error. It returns the exit code of a clean stop.
func (p *proc) stop() (int, error) {
	if p.exited() {
		return p.code, nil
	}
	if err := p.signal(syscall.SIGTERM); err != nil {
		return 0, err
	}
	code, err := p.wait(stopGrace)
	if err == nil {
		return code, nil
	}
	p.signal(syscall.SIGKILL)
	<-p.done
	return p.code, fmt.Errorf("%s ignored SIGTERM for %v; killed", p.name, stopGrace)
}

// groupGone reports whether no process of p's group is left (kill(-pgid, 0)
// fails with ESRCH), polling until d.
func (p *proc) groupGone(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if err := syscall.Kill(-p.cmd.Process.Pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond) // polling a kernel table: no event to wait on
	}
}

// logTail keeps every output line of a process and wakes waiters on each new
// line.
type logTail struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced on every append and at EOF
	eof     bool
}

func newLogTail() *logTail { return &logTail{changed: make(chan struct{})} }

func (l *logTail) pump(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		l.mu.Lock()
		l.lines = append(l.lines, sc.Text())
		close(l.changed)
		l.changed = make(chan struct{})
		l.mu.Unlock()
	}
	io.Copy(io.Discard, r) // an over-long line: keep draining so the child never blocks
	l.mu.Lock()
	l.eof = true
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// mark returns the number of lines seen so far, for waitLine's from.
func (l *logTail) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// waitLine returns the first line at index ≥ from that match accepts, waiting
// until ctx ends.
func (l *logTail) waitLine(ctx context.Context, from int, match func(string) bool) (string, error) {
	for {
		l.mu.Lock()
		for ; from < len(l.lines); from++ {
			if match(l.lines[from]) {
				line := l.lines[from]
				l.mu.Unlock()
				return line, nil
			}
		}
		ch, eof := l.changed, l.eof
		l.mu.Unlock()
		if eof {
			return "", errors.New("output closed before a matching line")
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// tail returns the last n lines joined.
func (l *logTail) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := l.lines
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestLogTailWaitLine checks the harness's own line waiter: a line that
// arrives later wakes it, from skips earlier lines, and EOF ends the wait.
func TestLogTailWaitLine(t *testing.T) {
	checkGoroutines(t)
	l := newLogTail()
	pr, pw := io.Pipe()
	go l.pump(pr)
	fmt.Fprintln(pw, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.waitLine(ctx, 0, func(s string) bool { return s == "a" }); err != nil {
		t.Fatalf("waitLine(a): %v", err)
	}
	from := l.mark()
	got := make(chan string, 1)
	go func() {
		line, _ := l.waitLine(ctx, from, func(s string) bool { return strings.HasPrefix(s, "b") || s == "a" })
		got <- line
	}()
	fmt.Fprintln(pw, "b1")
	if line := <-got; line != "b1" {
		t.Errorf("waitLine after mark: got %q, want b1", line)
	}
	pw.Close()
	if _, err := l.waitLine(ctx, l.mark(), func(string) bool { return false }); err == nil || ctx.Err() != nil {
		t.Errorf("waitLine at EOF: got err %v, want an output-closed error before the deadline", err)
	}
}
