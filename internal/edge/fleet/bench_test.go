package fleet

import (
	"fmt"
	"runtime"
	"testing"

	"iop/internal/edge/config"
	"iop/internal/edge/pool"
	iop "iop/proto/gen/iop"
)

func models200() []string {
	ms := make([]string, 200)
	for i := range ms {
		ms[i] = fmt.Sprintf("library/model-%03d:q4_K_M", i)
	}
	return ms
}

// D2: one discovery poll's cost on the edge for a node whose backend lists
// 200 models: the report unchanged (the usual poll: cleaned, compared,
// dropped), and changed (then the edge also recomputes its effective
// config: 200 groups, BenchmarkEffective200).
func BenchmarkReport200(b *testing.B) {
	e := newEdgeEnv(b, nil)
	ms := models200()
	r := report(&iop.AdapterModels{Adapter: "ollama", Models: ms})
	e.f.Report("gpu-1", 1, r)
	b.Run("unchanged", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			e.f.Report("gpu-1", 1, r)
		}
	})
	b.Run("changed", func(b *testing.B) {
		b.ReportAllocs()
		other := report(&iop.AdapterModels{Adapter: "ollama", Models: append(models200()[:199], "extra:latest")})
		i := 0
		for b.Loop() {
			if i%2 == 0 {
				e.f.Report("gpu-1", 1, other)
			} else {
				e.f.Report("gpu-1", 1, r)
			}
			i++
			for len(e.changed) > 0 {
				<-e.changed
			}
		}
	})
}

// D2: recomputing the effective config when a node's 200 models changed
// (model_discovery: one group per model), and projecting it onto the pool;
// retained-B is the heap the 200 models keep on the edge: the fleet's
// report, the effective config's groups and the pool built from them,
// less the same without the models.
func BenchmarkEffective200(b *testing.B) {
	e := newEdgeEnv(b, func(m map[string]any) {
		m["model_discovery"] = []any{map[string]any{"node": "gpu-*", "provider": "ollama"}}
	})
	file := e.cfg
	enrolled := []config.EnrolledNode{{ID: "gpu-1"}}
	disc := config.Discovered{"gpu-1": {"ollama": models200()}}
	b.Run("effective", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if c := file.Effective(enrolled, nil, disc); len(c.Models) != 201 {
				b.Fatalf("%d groups", len(c.Models))
			}
		}
	})
	b.Run("retained", func(b *testing.B) {
		retained := func(models []string) uint64 {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			f, _ := New(file, Options{})
			f.Report("gpu-1", 1, report(&iop.AdapterModels{Adapter: "ollama", Models: models}))
			en, rev, d := f.Inputs()
			c := file.Effective(append(en, enrolled...), rev, d)
			p := pool.New(poolConfig(c), pool.SystemClock())
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(f)
			runtime.KeepAlive(c)
			runtime.KeepAlive(p)
			return after.HeapAlloc - before.HeapAlloc
		}
		for b.Loop() {
			b.ReportMetric(float64(retained(models200()))-float64(retained(nil)), "retained-B/200-models")
		}
	})
}

// poolConfig is edge.PoolConfig's projection of groups and resources,
// enough for the pool's memory (the edge package cannot be imported here).
func poolConfig(c *config.Config) pool.Config {
	pc := pool.Config{MaxWaiters: 1024}
	for _, n := range c.Nodes {
		pc.Nodes = append(pc.Nodes, n.ID)
		for _, a := range n.Adapters {
			pc.Resources = append(pc.Resources, pool.Resource{Key: pool.Key{Node: n.ID, Provider: a.Name}, Capacity: a.Capacity,
				LongCapacity: *a.LongCapacity, Operations: config.Operations(&a)})
		}
	}
	for _, m := range c.Models {
		g := pool.Group{Name: m.Name}
		for _, mp := range m.Providers {
			g.Candidates = append(g.Candidates, pool.Candidate{Key: pool.Key{Node: mp.Node, Provider: mp.Provider}, Target: mp.Target})
		}
		pc.Groups = append(pc.Groups, g)
	}
	return pc
}
