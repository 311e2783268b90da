package adapter

import "testing"

// BenchmarkGate is the capacity gate on every run's and tunnel's path
// (SPEC E4): admit and release with two edges on one adapter name, the
// adapter far from full (admit) and full, every request refused (refuse).
func BenchmarkGate(b *testing.B) {
	for _, bc := range []struct {
		name  string
		limit int64
	}{{"admit", 1 << 40}, {"refuse", 1}} {
		b.Run(bc.name, func(b *testing.B) {
			c := NewCapacity()
			c.mu.Lock()
			g1 := c.gateLocked("one", "edge-1", bc.limit, 0)
			g2 := c.gateLocked("one", "edge-2", bc.limit, 0)
			c.mu.Unlock()
			if bc.limit == 1 {
				if why, _ := g2.tryAcquire(); why != admitted {
					b.Fatal("the one slot refused")
				}
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if why, _ := g1.tryAcquire(); why == admitted {
						g1.release()
					}
				}
			})
		})
	}
}
