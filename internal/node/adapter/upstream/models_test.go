package upstream

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
)

func endpoint(t testing.TB, h http.HandlerFunc) *Endpoint {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return &Endpoint{Client: srv.Client(), Base: u}
}

// tags is an Ollama GET /api/tags answer listing n models, each entry
// as Ollama 0.17 writes it (docs/api.md "List Local Models").
func tags(n int) string {
	var b strings.Builder
	b.WriteString(`{"models":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"library/model-%03d:q4_K_M","model":"library/model-%03d:q4_K_M","modified_at":"2026-12-01T11:56:27.788377289Z",`+
			`"size":4661224676,"digest":"0d43a55486e453ac4a8f3674a9554216845e2590e4955bca1aab44e4c61f043d",`+
			`"details":{"parent_model":"","format":"gguf","family":"llama","families":["llama"],"parameter_size":"8.0B","quantization_level":"Q4_K_M"}}`, i, i)
	}
	b.WriteString(`]}`)
	return b.String()
}

// D1: a models list is read in both shapes (OpenAI data[].id, Ollama
// models[].name), sorted and deduplicated, names over MaxModelName
// dropped; a non-2xx answer is a *StatusError.
func TestListModels(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		status     int
		want       []string
		wantErr    bool
	}{
		{"D1 Ollama tags", `{"models":[{"name":"tiny:latest"},{"name":"a:7b"},{"name":"tiny:latest"}]}`, 200, []string{"a:7b", "tiny:latest"}, false},
		{"D1 OpenAI list", `{"object":"list","data":[{"id":"qwen"},{"id":""},{"id":"` + strings.Repeat("x", MaxModelName+1) + `"}]}`, 200, []string{"qwen"}, false},
		{"D1 a 401", `{"error":"unauthorized"}`, 401, nil, true},
		{"D1 not JSON", `<html>`, 200, nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ep := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				w.Write([]byte(tt.body))
			})
			got, err := ListModels(context.Background(), ep, "/api/tags")
			var se *StatusError
			switch {
			case tt.wantErr && err == nil:
				t.Fatalf("got %v, want an error", got)
			case !tt.wantErr && (err != nil || !slices.Equal(got, tt.want)):
				t.Fatalf("got %v, %v; want %v", got, err, tt.want)
			case tt.status == 401 && !errors.As(err, &se):
				t.Fatalf("got %v, want a *StatusError", err)
			}
		})
	}
	ep := endpoint(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(tags(MaxModels + 10))) })
	if got, err := ListModels(context.Background(), ep, "/api/tags"); err != nil || len(got) != MaxModels {
		t.Fatalf("D1 %d models listed: kept %d (%v), want %d", MaxModels+10, len(got), err, MaxModels)
	}
}

// D1: one discovery poll's cost on the node for a backend listing 200
// models (an /api/tags answer of about 90 KB, over loopback HTTP).
func BenchmarkListModels200(b *testing.B) {
	body := tags(200)
	ep := endpoint(b, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(body)) })
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if ms, err := ListModels(context.Background(), ep, "/api/tags"); err != nil || len(ms) != 200 {
			b.Fatal(len(ms), err)
		}
	}
}
