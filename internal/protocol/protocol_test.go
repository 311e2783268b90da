package protocol

import (
	"net/http"
	"testing"
)

// W4, H4: every failure code is in Failures exactly once, with an emitter,
// a client status and a client code; Lookup finds each and gives Unknown
// (no retry, no health verdict, 502) for any other.
func TestFailuresOnce(t *testing.T) {
	seen := map[Code]bool{}
	for _, f := range Failures {
		if seen[f.Code] {
			t.Errorf("%s: listed twice", f.Code)
		}
		seen[f.Code] = true
		if f.Emitter == "" || f.Status < 400 || f.ClientCode == "" || f.Message == "" {
			t.Errorf("%s: incomplete row %+v", f.Code, f)
		}
		if got, ok := Lookup(string(f.Code)); !ok || got != f {
			t.Errorf("Lookup(%s) = %+v, %v", f.Code, got, ok)
		}
	}
	u, ok := Lookup("from_a_newer_node")
	if ok || u.Retry != RetryNever || u.Health != HealthNone || u.Status != http.StatusBadGateway || u.Code != "from_a_newer_node" {
		t.Errorf("unknown code: %+v, %v", u, ok)
	}
}

// H2: each health value pairs with exactly one liveness classification;
// anything else is unknown (fail closed).
func TestLiveness(t *testing.T) {
	for h, want := range map[string]string{HealthAvailable: LivenessRequestStalled, HealthUnavailable: LivenessProviderUnhealthy,
		HealthUnknown: LivenessHealthUnknown, "bogus": LivenessHealthUnknown} {
		if got := Liveness(h); got != want {
			t.Errorf("Liveness(%q) = %q, want %q", h, got, want)
		}
	}
}

// T1: the ollama adapter's built-in profile is Ollama's /v1 layer, the
// same paths as the openai_compat "ollama" profile, without an auth header.
func TestOllamaProfile(t *testing.T) {
	named, ok := NamedProfile(ProfileOllama)
	if !ok {
		t.Fatal("no ollama profile")
	}
	p := OllamaProfile("http://127.0.0.1:11434")
	n := named.Concrete("http://127.0.0.1:11434")
	if p.AuthHeader != "" || p.ChatCompletionsPath != n.ChatCompletionsPath || p.ResponsesPath != n.ResponsesPath ||
		p.HealthPath != "/api/tags" || p.CountTokensPath != "" || !p.NativeTools {
		t.Fatalf("ollama built-in profile %v, named %v", p, n)
	}
	if _, ok := NamedProfile("nope"); ok {
		t.Fatal("unknown profile found")
	}
}
