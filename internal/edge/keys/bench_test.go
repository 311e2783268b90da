package keys

import (
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"testing"
	"time"

	"iop/internal/edge/keystore"
)

// benchSet builds a store of n keys, each with a scope, every bound and
// an expiry (the most work per request), and returns the registry and the
// keys.
func benchSet(b *testing.B, n int) (*Registry, []string) {
	b.Helper()
	st := keystore.New()
	secrets := make([]string, n)
	for i := range n {
		k, err := st.Create(keystore.Spec{Name: fmt.Sprintf("team-%05d", i), Models: []string{"tiny", "qwen3*"},
			Limits:    keystore.Limits{RequestsPerMinute: 1 << 30, TokensPerMinute: 1 << 40, TokensPerDay: 1 << 40, MaxConcurrent: 1 << 20},
			ExpiresAt: noon.Add(24 * time.Hour)}, noon.Add(-time.Hour))
		if err != nil {
			b.Fatal(err)
		}
		secrets[i] = k
	}
	s, err := Build(nil, st, true, 1)
	if err != nil {
		b.Fatal(err)
	}
	return New(s), secrets
}

// request is the key path of one model request as the HTTP layer runs it:
// authenticate, check the scope, admit with an estimate, write the
// headers, finish with the reported usage.
func request(b *testing.B, reg *Registry, key string, h http.Header, now time.Time) {
	p, err := reg.Authenticate(key, now)
	if err != nil || !p.Allows("qwen3:8b") {
		b.Fatal("refused", err)
	}
	t, ref := reg.Admit(p, now)
	if ref == nil {
		ref = t.Reserve(300, now)
	}
	if ref != nil {
		b.Fatal(ref)
	}
	t.RateLimit.WriteOpenAI(h)
	t.Finish(Outcome{PromptTokens: 100, CompletionTokens: 200, Reported: true, Answered: true}, now)
}

// BenchmarkRequest: the key path of one request (Authenticate, Allows,
// Admit, the OpenAI headers, Finish) with 1 and 10,000 keys in the store;
// "one key" sends the same key every time, "spread" cycles through all of
// them (every lookup a different map entry and budget). p50-ns is the
// median of per-request times measured with the wall clock, batches of
// 64 (the clock's own cost divided out).
func BenchmarkRequest(b *testing.B) {
	for _, n := range []int{1, 10000} {
		for _, spread := range []bool{false, true} {
			if n == 1 && spread {
				continue
			}
			name := fmt.Sprintf("keys=%d/one_key", n)
			if spread {
				name = fmt.Sprintf("keys=%d/spread", n)
			}
			b.Run(name, func(b *testing.B) {
				reg, secrets := benchSet(b, n)
				h := http.Header{}
				i := 0
				perRequest(b, func() {
					key := secrets[0]
					if spread {
						key = secrets[i%n]
					}
					i++
					request(b, reg, key, h, noon)
				})
			})
		}
	}
}

// perRequest runs fn in batches of 64 per b.Loop iteration and reports
// the mean (ns/request) and the median of the batches' per-request times
// (p50-ns/request): on a shared machine the mean carries every other
// process's preemptions, the median far fewer.
func perRequest(b *testing.B, fn func()) {
	const batch = 64
	var lat []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		for range batch {
			fn()
		}
		lat = append(lat, time.Since(start)/batch)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns/request")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/request")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkAccounting: the cost of the budget accounting alone per
// request (Admit and Finish: the in-flight slot, the request bucket, the
// token reservation and its settlement, the counters), one key.
func BenchmarkAccounting(b *testing.B) {
	reg, secrets := benchSet(b, 1)
	p, _ := reg.Authenticate(secrets[0], noon)
	perRequest(b, func() {
		t, ref := reg.Admit(p, noon)
		if ref == nil {
			ref = t.Reserve(300, noon)
		}
		if ref != nil {
			b.Fatal(ref)
		}
		t.Finish(Outcome{PromptTokens: 100, CompletionTokens: 200, Reported: true, Answered: true}, noon)
	})
}

// BenchmarkMemoryPerKey: the heap one key takes: the store's entry, the
// set's index and principal, and the registry's state once the key made a
// request (counters, in-flight and rate entry, token budgets); 10,000
// keys, reported per key.
func BenchmarkMemoryPerKey(b *testing.B) {
	const n = 10000
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		reg, secrets := benchSet(b, n)
		for _, k := range secrets {
			request(b, reg, k, http.Header{}, noon)
		}
		secretsLen := 0
		for _, k := range secrets {
			secretsLen += len(k) + 16 // the test's own slice of keys, not the Edge's
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc-uint64(secretsLen))/n, "B/key")
		runtime.KeepAlive(reg)
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkLoad: reading and indexing a store file of 10,000 keys, as
// the Edge does on every change of the file.
func BenchmarkLoad(b *testing.B) {
	st := keystore.New()
	for i := range 10000 {
		if _, err := st.Create(keystore.Spec{Name: fmt.Sprintf("team-%05d", i), Models: []string{"tiny", "qwen3*"},
			Limits: keystore.Limits{TokensPerDay: 1000}}, noon); err != nil {
			b.Fatal(err)
		}
	}
	path := b.TempDir() + "/keys.json"
	if err := st.Save(path); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		s, err := keystore.Load(path)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Build(nil, s, true, 1); err != nil {
			b.Fatal(err)
		}
	}
}
