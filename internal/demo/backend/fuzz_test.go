package backend

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseModelName: the fault-suffix parser never panics, accepts only
// well-formed suffixes and keeps the base name intact.
func FuzzParseModelName(f *testing.F) {
	for _, s := range []string{"tiny", "tiny:latest", "tiny+stall=3", "tiny-loop+reset=0+slowheaders=2s",
		"tiny+status=503", "tiny+", "+", "tiny+stall", "tiny+status=99", "a:b:c+stall=1+stall=2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		echo, name, flt, err := parseModelName(s)
		if err != nil && !errors.Is(err, ErrBadFault) {
			t.Fatalf("%q: error %v does not wrap ErrBadFault", s, err)
		}
		if !strings.HasPrefix(s, echo) || strings.Contains(echo, "+") {
			t.Fatalf("%q: echo %q is not the part before '+'", s, echo)
		}
		if name != echo && name+":latest" != echo {
			t.Fatalf("%q: name %q is neither %q nor its untagged form", s, name, echo)
		}
		if err == nil && (flt.status != 0 && (flt.status < 400 || flt.status > 599) || flt.slowHeaders < 0 || flt.slowHeaders > maxSlowHeaders) {
			t.Fatalf("%q: accepted out-of-range fault %+v", s, flt)
		}
	})
}

// TestParseModelName: table of names and faults (the demo backend's fault suffixes).
func TestParseModelName(t *testing.T) {
	tests := []struct {
		in, echo, name string
		stall, reset   int
		status         int
		bad            bool
	}{
		{in: "tiny", echo: "tiny", name: "tiny", stall: -1, reset: -1},
		{in: "tiny:latest", echo: "tiny:latest", name: "tiny", stall: -1, reset: -1},
		{in: "tiny:q4", echo: "tiny:q4", name: "tiny:q4", stall: -1, reset: -1},
		{in: "tiny+stall=3", echo: "tiny", name: "tiny", stall: 3, reset: -1},
		{in: "tiny-loop:latest+reset=0+status=503", echo: "tiny-loop:latest", name: "tiny-loop", stall: -1, reset: 0, status: 503},
		{in: "tiny+stall=-1", bad: true},
		{in: "tiny+", bad: true},
		{in: "tiny+stall=1+", bad: true},
		{in: "tiny+status=600", bad: true},
		{in: "tiny+slowheaders=11m", bad: true},
	}
	for _, tt := range tests {
		t.Run("issue6 "+tt.in, func(t *testing.T) {
			echo, name, f, err := parseModelName(tt.in)
			if tt.bad {
				if !errors.Is(err, ErrBadFault) {
					t.Errorf("got %v, want ErrBadFault", err)
				}
				return
			}
			if err != nil || echo != tt.echo || name != tt.name || f.stall != tt.stall || f.reset != tt.reset || f.status != tt.status {
				t.Errorf("got %q %q %+v %v, want %q %q stall %d reset %d status %d",
					echo, name, f, err, tt.echo, tt.name, tt.stall, tt.reset, tt.status)
			}
		})
	}
}
