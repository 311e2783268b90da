package tracing

import (
	"strings"
	"testing"
)

// W3C Trace Context §3.2 and §3.3: the traceparent and tracestate a client
// sends are continued when valid and ignored (a new root trace, nothing
// propagated) when not.
func TestParse(t *testing.T) {
	const tid, pid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	valid := "00-" + tid + "-" + pid + "-01"
	long := strings.Repeat("a", 200)
	for _, tc := range []struct {
		name        string
		parent      []string
		state       []string
		ok, sampled bool
		wantState   string
	}{
		{"valid sampled", []string{valid}, nil, true, true, ""},
		{"valid not sampled", []string{"00-" + tid + "-" + pid + "-00"}, nil, true, false, ""},
		{"other flag bits", []string{"00-" + tid + "-" + pid + "-03"}, nil, true, true, ""},
		{"absent", nil, nil, false, false, ""},
		{"twice", []string{valid, valid}, nil, false, false, ""},
		{"version ff", []string{"ff-" + tid + "-" + pid + "-01"}, nil, false, false, ""},
		{"version 00 too long", []string{valid + "-00"}, nil, false, false, ""},
		{"future version with more fields", []string{"cc-" + tid + "-" + pid + "-01-what-the-future-will-be"}, nil, true, true, ""},
		{"future version, no dash after flags", []string{"cc-" + tid + "-" + pid + "-01x"}, nil, false, false, ""},
		{"uppercase hex", []string{"00-" + strings.ToUpper(tid) + "-" + pid + "-01"}, nil, false, false, ""},
		{"zero trace id", []string{"00-" + strings.Repeat("0", 32) + "-" + pid + "-01"}, nil, false, false, ""},
		{"zero parent id", []string{"00-" + tid + "-" + strings.Repeat("0", 16) + "-01"}, nil, false, false, ""},
		{"short", []string{valid[:54]}, nil, false, false, ""},
		{"bad flags", []string{"00-" + tid + "-" + pid + "-0g"}, nil, false, false, ""},
		{"separator", []string{"00_" + tid + "-" + pid + "-01"}, nil, false, false, ""},
		{"tracestate kept", []string{valid}, []string{"congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"}, true, true, "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"},
		{"tracestate headers joined", []string{valid}, []string{"congo=a", "rojo=b"}, true, true, "congo=a,rojo=b"},
		{"tracestate multi-tenant key", []string{valid}, []string{"fw529a3039@dt=x,0tenant@sys=y"}, true, true, "fw529a3039@dt=x,0tenant@sys=y"},
		{"tracestate empty members", []string{valid}, []string{"a=1,,  ,b=2"}, true, true, "a=1,,  ,b=2"},
		{"tracestate uppercase key", []string{valid}, []string{"Congo=t61"}, true, true, ""},
		{"tracestate no value", []string{valid}, []string{"congo="}, true, true, ""},
		{"tracestate control char", []string{valid}, []string{"congo=a\nb"}, true, true, ""},
		{"tracestate too long", []string{valid}, []string{"a=" + long + ",b=" + long + ",c=" + long}, true, true, ""},
		{"tracestate 33 members", []string{valid}, []string{strings.Repeat("k=v,", 32) + "k=v"}, true, true, ""},
		{"tracestate without traceparent", nil, []string{"congo=a"}, false, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := Parse(tc.parent, tc.state)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				if c != (Context{}) {
					t.Errorf("invalid header left %+v, want the zero Context", c)
				}
				return
			}
			if c.Sampled != tc.sampled {
				t.Errorf("sampled = %v, want %v", c.Sampled, tc.sampled)
			}
			if c.TraceID.String() != tid || c.SpanID.String() != pid {
				t.Errorf("ids %s %s, want %s %s", c.TraceID, c.SpanID, tid, pid)
			}
			if c.State != tc.wantState {
				t.Errorf("state %q, want %q", c.State, tc.wantState)
			}
		})
	}
}

// A request without trace headers costs Parse no allocation.
func TestParseAllocs(t *testing.T) {
	h := []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	if n := testing.AllocsPerRun(100, func() { Parse(h, nil) }); n != 0 {
		t.Errorf("Parse allocated %v times, want 0", n)
	}
}

// Sampling: ratio 1 samples all, 0 none; the decision is the trace id's
// rightmost 56 bits against ratio × 2⁵⁶, the same for the same id.
func TestSample(t *testing.T) {
	id := func(low7 string) TraceID {
		var t TraceID
		if !decodeHex(t[9:], low7) {
			panic(low7)
		}
		t[0] = 0xff // the leftmost bytes do not count
		return t
	}
	half := id("80000000000000")
	for _, tc := range []struct {
		name  string
		id    TraceID
		ratio float64
		want  bool
	}{
		{"ratio 1", id("ffffffffffffff"), 1, true},
		{"ratio above 1", id("ffffffffffffff"), 2, true},
		{"ratio 0", id("00000000000000"), 0, false},
		{"negative", id("00000000000000"), -1, false},
		{"just below half", id("7fffffffffffff"), 0.5, true},
		{"exactly half", half, 0.5, false},
		{"low id at 1%", id("00000000000001"), 0.01, true},
		{"high id at 1%", id("10000000000000"), 0.01, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Sample(tc.id, tc.ratio); got != tc.want {
				t.Errorf("Sample(%s, %v) = %v, want %v", tc.id, tc.ratio, got, tc.want)
			}
			if Sample(tc.id, tc.ratio) != Sample(tc.id, tc.ratio) {
				t.Error("the same id decided two ways")
			}
		})
	}
	n := 0
	for range 20000 {
		if Sample(NewTraceID(), 0.25) {
			n++
		}
	}
	if n < 4500 || n > 5500 {
		t.Errorf("ratio 0.25 sampled %d of 20000 random ids, want about 5000", n)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "congo=t61rcWkgMzE")
	f.Add("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", "a@b=c,,d=e")
	f.Fuzz(func(t *testing.T, p, s string) {
		c, ok := Parse([]string{p}, []string{s})
		if !ok {
			return
		}
		if c.TraceID.IsZero() || c.SpanID.IsZero() {
			t.Fatalf("valid context with a zero id: %q", p)
		}
		if len(c.State) > MaxTracestateBytes || !printable(c.State) {
			t.Fatalf("state %q kept", c.State)
		}
	})
}
