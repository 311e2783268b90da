package config

import (
	"strings"
	"testing"

	"iop/internal/protocol"
)

// TestFairShareConfig: queue.starvation_grants and api_keys[]' weight,
// class and max_class default as documented and are refused out of range,
// naming the field (SPEC G1, G2, G4).
func TestFairShareConfig(t *testing.T) {
	c := mustParse(t, valid)
	if c.Queue.StarvationGrants != DefaultStarvationGrants {
		t.Errorf("G2 queue.starvation_grants default %d, want %d", c.Queue.StarvationGrants, DefaultStarvationGrants)
	}
	if k := c.APIKeys[0]; k.Weight != 1 || k.Class != ClassInteractive || k.MaxClass != ClassInteractive {
		t.Errorf("G1 G4 api key defaults weight %d class %q max_class %q, want 1, interactive, interactive", k.Weight, k.Class, k.MaxClass)
	}
	rows := []struct {
		name, queue, key, want string
	}{
		{"G2 starvation_grants below 1", `"starvation_grants": -1`, ``, "queue.starvation_grants: must be between 1 and 1000, got -1"},
		{"G2 starvation_grants above 1000", `"starvation_grants": 1001`, ``, "queue.starvation_grants: must be between 1 and 1000, got 1001"},
		{"G1 weight out of range", ``, `"weight": 1001`, "api_keys[0].weight: must be between 1 and 1000, got 1001"},
		{"G4 unknown class", ``, `"class": "urgent"`, `api_keys[0].class: must be critical, interactive or batch, got "urgent"`},
		{"G4 unknown max_class", ``, `"max_class": "top"`, `api_keys[0].max_class: must be critical, interactive or batch, got "top"`},
		{"G4 class above max_class", ``, `"class": "critical", "max_class": "batch"`, `api_keys[0].class: "critical" is above the key's max_class "batch"`},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			s := valid
			if r.queue != "" {
				s = strings.Replace(s, `"models":`, `"queue": {`+r.queue+`}, "models":`, 1)
			}
			if r.key != "" {
				s = strings.Replace(s, `"key_sha256":`, r.key+`, "key_sha256":`, 1)
			}
			_, err := Parse([]byte(s))
			if err == nil || !strings.Contains(err.Error(), r.want) {
				t.Fatalf("err %v, want it to say %q", err, r.want)
			}
		})
	}
	ok := strings.Replace(valid, `"key_sha256":`, `"weight": 3, "class": "batch", "max_class": "critical", "key_sha256":`, 1)
	if k := mustParse(t, ok).APIKeys[0]; k.Weight != 3 || k.Class != ClassBatch || k.MaxClass != ClassCritical {
		t.Errorf("G4 parsed %+v", k)
	}
}

// TestG7PriorityFieldConfig: profile_overrides.priority_field is off for
// every profile unless set; "lower_first" and "higher_first" reach the
// node's payload as the class → value table; anything else is refused
// naming the key and the values it takes (SPEC G7).
func TestG7PriorityFieldConfig(t *testing.T) {
	for _, name := range []string{protocol.ProfileOpenAI, protocol.ProfileVLLM, protocol.ProfileLlamaCpp, protocol.ProfileOllama} {
		if f := ResolveProfile(&Adapter{Type: protocol.TypeOpenAICompat, Profile: name}).GetPriorityField(); f != nil {
			t.Errorf("G7 profile %s sends a priority field by default: %v", name, f)
		}
	}
	field := func(v string) string {
		return strings.Replace(valid, `"api_key_env": "LLAMA_KEY"`, `"api_key_env": "LLAMA_KEY", "profile_overrides": {"priority_field": `+v+`}`, 1)
	}
	rows := []struct {
		name, value          string
		critical, inter, bat int32
		off                  bool
	}{
		{"G7 lower_first: vLLM's order", `"lower_first"`, -1, 0, 1, false},
		{"G7 higher_first: SGLang's default order", `"higher_first"`, 1, 0, -1, false},
		{"G7 empty is off", `""`, 0, 0, 0, true},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			p := mustParse(t, field(r.value)).NodePayload("gpu-1")
			f := p.GetAdapters()[1].GetOpenaiCompat().GetProtocolProfile().GetPriorityField()
			if r.off {
				if f != nil {
					t.Fatalf("priority_field %v, want none", f)
				}
				return
			}
			if f == nil || f.GetCritical() != r.critical || f.GetInteractive() != r.inter || f.GetBatch() != r.bat {
				t.Fatalf("priority_field %v, want critical %d interactive %d batch %d", f, r.critical, r.inter, r.bat)
			}
		})
	}
	_, err := Parse([]byte(field(`"vllm"`)))
	want := `nodes[0].adapters[1].profile_overrides.priority_field: want "lower_first"`
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `got "vllm"`) {
		t.Fatalf("err %v, want it to say %q and the value given", err, want)
	}
}
