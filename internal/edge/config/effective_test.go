package config

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// fleetConfig is a config with one node of its own (static-1), a node
// template for gpu-* and providers naming the glob.
const fleetConfig = `{
  "tls": {"cert_file": "e.crt", "key_file": "e.key", "ca_file": "ca.crt"},
  "nodes": [{"id": "static-1", "adapters": [{"name": "ollama", "type": "ollama", "base_url": "http://127.0.0.1:11434"}]}],
  "node_templates": [
    {"match": "gpu-big-*", "adapters": [{"name": "vllm", "type": "openai_compat", "profile": "vllm", "base_url": "http://127.0.0.1:8000"}]},
    {"match": "gpu-*", "adapters": [{"name": "ollama", "type": "ollama", "base_url": "http://127.0.0.1:11434"}]}
  ],
  "models": [
    {"name": "tiny", "max_attempts": 3, "providers": [{"node": "gpu-*", "provider": "ollama", "target": "tiny"},
                                     {"node": "static-1", "provider": "ollama", "target": "tiny"}]},
    {"name": "llama", "providers": [{"node": "*", "provider": "ollama", "target": "llama3*"}]},
    {"name": "big", "providers": [{"node": "gpu-big-*", "provider": "vllm", "target": "qwen"}]}
  ],
  "model_discovery": [{"node": "*", "provider": "ollama", "match": "*", "aliases": {"qwen2.5:7b": "qwen"}}]
}`

type route struct{ node, provider, target string }

func routes(m *Model) []route {
	var out []route
	for _, p := range m.Providers {
		out = append(out, route{p.Node, p.Provider, p.Target})
	}
	return out
}

// J7 D2: Effective adds enrolled nodes with their template's adapters,
// expands node and target globs, makes one group per discovered model
// (alias, ":latest" dropped, a configured name never taken) and drops a
// group left without providers.
func TestEffective(t *testing.T) {
	c := mustParse(t, fleetConfig)
	enrolled := []EnrolledNode{{ID: "gpu-2", LeaseRecipientPublicKey: "k2"}, {ID: "gpu-1"}, {ID: "gpu-big-1"},
		{ID: "cpu-1"}, {ID: "static-1"}}
	disc := Discovered{
		"gpu-1":    {"ollama": {"llama3:8b", "qwen2.5:7b", "tiny:latest"}},
		"gpu-2":    {"ollama": {"llama3.1:70b", "tiny:latest"}},
		"static-1": {"ollama": {"tiny"}},
	}
	e := c.Effective(enrolled, nil, disc)

	var ids []string
	for _, n := range e.Nodes {
		ids = append(ids, n.ID)
	}
	if want := []string{"static-1", "gpu-1", "gpu-2", "gpu-big-1"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("J7 nodes %v, want %v (cpu-1 matches no template; static-1 is the config's)", ids, want)
	}
	if n := e.NodeByID("gpu-2"); !n.Enrolled || n.LeaseRecipientPublicKey != "k2" || n.Adapter("ollama") == nil {
		t.Errorf("J7 gpu-2: %+v", n)
	}
	if n := e.NodeByID("gpu-big-1"); n.Adapter("vllm") == nil || n.Adapter("ollama") != nil {
		t.Errorf("J7 gpu-big-1 takes the first matching template: %+v", n.Adapters)
	}
	if e.NodeByID("static-1").Enrolled {
		t.Error("J7 a node of the config file is marked enrolled")
	}
	for _, tt := range []struct {
		model string
		want  []route
	}{
		{"tiny", []route{{"gpu-1", "ollama", "tiny"}, {"gpu-2", "ollama", "tiny"}, {"static-1", "ollama", "tiny"}}},
		{"llama", []route{{"gpu-1", "ollama", "llama3:8b"}, {"gpu-2", "ollama", "llama3.1:70b"}}},
		{"big", []route{{"gpu-big-1", "vllm", "qwen"}}},
		{"qwen", []route{{"gpu-1", "ollama", "qwen2.5:7b"}}},
		{"llama3:8b", []route{{"gpu-1", "ollama", "llama3:8b"}}},
		{"llama3.1:70b", []route{{"gpu-2", "ollama", "llama3.1:70b"}}},
	} {
		t.Run("J7 D2 "+tt.model, func(t *testing.T) {
			m := e.ModelByName(tt.model)
			if m == nil {
				t.Fatalf("no group %q", tt.model)
			}
			if got := routes(m); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("providers %v, want %v", got, tt.want)
			}
		})
	}
	if m := e.ModelByName("tiny"); m.MaxAttempts != 3 || len(e.ModelByName("tiny").Providers) != 3 {
		t.Errorf("Q1 tiny: max_attempts %d", m.MaxAttempts)
	}
	var names []string
	for _, m := range e.Models {
		names = append(names, m.Name)
	}
	if want := []string{"tiny", "llama", "big", "llama3.1:70b", "llama3:8b", "qwen"}; !reflect.DeepEqual(names, want) {
		t.Errorf("D2 groups %v, want %v (configured first, discovered by name; tiny:latest is the configured tiny)", names, want)
	}

	// Nothing enrolled, nothing discovered: only the config's own node.
	bare := c.Effective(nil, nil, nil)
	if len(bare.Nodes) != 1 || bare.ModelByName("llama") != nil || bare.ModelByName("big") != nil {
		t.Errorf("J7 with no fleet: nodes %d, llama %v, big %v", len(bare.Nodes), bare.ModelByName("llama"), bare.ModelByName("big"))
	}
	if m := bare.ModelByName("tiny"); m == nil || m.MaxAttempts != 1 {
		t.Errorf("Q1 max_attempts capped at the providers left: %+v", m)
	}
	// J6: a revoked name is neither the config's node nor an enrolled one.
	rev := c.Effective(enrolled, map[string]bool{"static-1": true, "gpu-1": true}, disc)
	if rev.NodeByID("static-1") != nil {
		t.Error("J6 a revoked node of the config file stays")
	}
	if !c.Discovers("gpu-7", "ollama") || c.Discovers("gpu-big-7", "vllm") || !e.Discovers("gpu-1", "ollama") {
		t.Error("D1 Discovers")
	}
	if p := e.NodePayload("gpu-1"); p.GetAdapters()[0].GetDiscoveryIntervalMs() != DefaultDiscoveryIntervalMs ||
		!p.GetRuntime().GetCertificateRenewal() {
		t.Errorf("D1 J5 gpu-1's payload: %v", p)
	}
	if p := e.NodePayload("gpu-big-1"); p.GetAdapters()[0].GetDiscoveryIntervalMs() != 0 {
		t.Error("D1 an adapter nobody discovers from polls")
	}
	if p := e.NodePayload("static-1"); p.GetRuntime().GetCertificateRenewal() {
		t.Error("J5 the config's own node is asked to renew")
	}
	if c.Models[0].Providers[0].Node != "gpu-*" || len(c.Nodes) != 1 {
		t.Error("Effective changed the config it was given")
	}
}

// D2: a discovered name becomes a group only if models[].name would take
// it (a node or its backend may report anything: ":latest" would be a
// group named "", " x" one with a leading space), and a group counts each
// (node, provider) once, as a configured one does: a backend listing "foo"
// and "foo:latest" gives group foo one provider, the first by name.
func TestEffectiveDiscoveredNames(t *testing.T) {
	c := mustParse(t, fleetConfig)
	e := c.Effective([]EnrolledNode{{ID: "gpu-1"}}, nil, Discovered{
		"gpu-1": {"ollama": {" x", ":latest", "foo", "foo:latest", "x "}},
	})
	var names []string
	for _, m := range e.Models {
		names = append(names, m.Name)
	}
	if want := []string{"tiny", "foo"}; !reflect.DeepEqual(names, want) {
		t.Errorf("D2 groups %q, want %q", names, want)
	}
	if m := e.ModelByName("foo"); m == nil || !reflect.DeepEqual(routes(m), []route{{"gpu-1", "ollama", "foo"}}) {
		t.Errorf("D2 foo's providers: %+v", m)
	}
}

// J7 D2 N6: the keys of templates, node and target globs and discovery,
// one row per refusal, each naming its path.
func TestValidateFleetKeys(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"J7 no nodes but a template", func(m map[string]any) {
			delete(m, "nodes")
			mm := m["models"].([]any)[0].(map[string]any)
			mm["providers"], mm["max_attempts"] = mm["providers"].([]any)[:1], 0
		}, ""},
		{"J7 neither nodes nor templates", func(m map[string]any) { delete(m, "nodes"); delete(m, "node_templates") }, "nodes: at least one node or node template"},
		{"J7 template without match", func(m map[string]any) { tmpl(m, 0)["match"] = "" }, "node_templates[0].match: required"},
		{"J7 template with a bad glob", func(m map[string]any) { tmpl(m, 0)["match"] = "gpu-[0-9]" }, "node_templates[0].match: invalid glob"},
		{"J7 template without adapters", func(m map[string]any) { tmpl(m, 1)["adapters"] = []any{} }, "node_templates[1].adapters: at least one"},
		{"J7 template adapter checked like a node's", func(m map[string]any) {
			tmpl(m, 1)["adapters"].([]any)[0].(map[string]any)["capacity"] = -1
		}, "node_templates[1].adapters[0].capacity"},
		{"J7 glob provider with no such adapter", func(m map[string]any) { prov(m, 0, 0)["provider"] = "vllm2" }, `models[0].providers[0].provider: no node matching "gpu-*"`},
		{"J7 a bad node glob", func(m map[string]any) { prov(m, 0, 0)["node"] = "gpu-* x" }, "models[0].providers[0].node: invalid glob"},
		{"D2 a bad target glob", func(m map[string]any) { prov(m, 1, 0)["target"] = "llama{3,4}*" }, "models[1].providers[0].target: invalid glob"},
		{"J7 a template's node by name", func(m map[string]any) { prov(m, 2, 0)["node"] = "gpu-big-9" }, ""},
		{"J7 an unknown node by name", func(m map[string]any) { prov(m, 2, 0)["node"] = "cpu-9" }, "no configured node \"cpu-9\" (and no node template matches it)"},
		{"D2 discovery without provider", func(m map[string]any) { disc(m)["provider"] = "" }, "model_discovery[0].provider"},
		{"D2 discovery with a bad glob", func(m map[string]any) { disc(m)["match"] = "[a-z]*" }, "model_discovery[0].match: invalid glob"},
		{"D2 discovery with a bad routing", func(m map[string]any) { disc(m)["routing"] = "random" }, "model_discovery[0].routing"},
		{"D2 an alias to an empty name", func(m map[string]any) { disc(m)["aliases"] = map[string]any{"x": ""} }, "model_discovery[0].aliases"},
		{"D1 a poll interval too short", func(m map[string]any) { m["discovery"] = map[string]any{"poll_interval_ms": 10} }, "discovery.poll_interval_ms"},
		{"J5 a certificate lifetime under a minute", func(m map[string]any) { m["enrollment"] = map[string]any{"certificate_ttl_ms": 1000} }, "enrollment.certificate_ttl_ms"},
		{"N6 a template whose payload a node cannot read before ready", func(m map[string]any) {
			var ads []any
			for i := range 200 {
				ads = append(ads, map[string]any{"name": fmt.Sprintf("a%03d", i), "type": "openai_compat", "profile": "vllm",
					"base_url": "http://127.0.0.1:8000/" + strings.Repeat("p", 200)})
			}
			tmpl(m, 1)["adapters"] = ads
		}, "node_templates[1].adapters: a matching node's config payload would be"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var m map[string]any
			if err := json.Unmarshal([]byte(fleetConfig), &m); err != nil {
				t.Fatal(err)
			}
			tt.edit(m)
			b, _ := json.Marshal(m)
			_, err := Parse(b)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

func tmpl(m map[string]any, i int) map[string]any {
	return m["node_templates"].([]any)[i].(map[string]any)
}

func prov(m map[string]any, model, i int) map[string]any {
	return m["models"].([]any)[model].(map[string]any)["providers"].([]any)[i].(map[string]any)
}

func disc(m map[string]any) map[string]any {
	return m["model_discovery"].([]any)[0].(map[string]any)
}
