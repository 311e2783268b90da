package main

import (
	"math"
	"testing"
)

func TestJain(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{[]float64{5, 5, 5}, 1}, {[]float64{1, 0, 0, 0}, 0.25}, {nil, 0}, {[]float64{1, 2}, 0.9}} {
		if got := jain(c.xs); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("jain(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}

func TestParseFlood(t *testing.T) {
	f, err := parseFlood("f3:key-3:16:50:2")
	if err != nil || f.label != "f3" || f.key != "key-3" || f.streams != 16 || f.maxTokens != 50 || f.weight != 2 {
		t.Fatalf("parseFlood = %+v, %v", f, err)
	}
	for _, bad := range []string{"f:k:16:50", "f:k:0:50:1", "f:k:x:50:1"} {
		if _, err := parseFlood(bad); err == nil {
			t.Errorf("parseFlood(%q): no error", bad)
		}
	}
}
