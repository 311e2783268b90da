package jsonconfig

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

type testAdapter struct {
	Name     string  `json:"name"`
	Capacity int     `json:"capacity"`
	Weight   float64 `json:"weight"`
	Small    int8    `json:"small"`
	Count    uint32  `json:"count"`
	On       *bool   `json:"on"`
}

type testNode struct {
	ID       string            `json:"id"`
	Adapters []testAdapter     `json:"adapters"`
	Labels   map[string]string `json:"labels"`
}

type testConfig struct {
	Listen string     `json:"listen"`
	Nodes  []testNode `json:"nodes"`
	Queue  struct {
		Max int `json:"max"`
	} `json:"queue"`
	At time.Time `json:"at"`
}

// README (Edge config reference): a value of the wrong JSON type is an
// error naming its full key path, indices included, like an unknown key,
// and every such problem is reported at once (encoding/json's own type
// error named only the first, as "nodes.adapters.capacity").
func TestDecodeNamesEveryTypeMismatchWithItsPath(t *testing.T) {
	rows := []struct {
		name   string
		json   string
		want   Errors
		usable bool
	}{
		{"valid", `{"listen":"a:1","nodes":[{"id":"n","adapters":[{"name":"x","capacity":2,"weight":0.5,"small":-3,"count":7,"on":true}],"labels":{"k":"v"}}],"queue":{"max":1}}`,
			nil, true},
		{"nulls leave fields alone", `{"listen":null,"nodes":[{"id":null,"adapters":null}],"queue":null}`, nil, true},
		{"indexed path", `{"nodes":[{"id":"a"},{"id":"b","adapters":[{},{"capacity":"8"}]}]}`,
			Errors{`nodes[1].adapters[1].capacity: want an integer, got JSON string`}, false},
		{"every mismatch and unknown key at once", `{"listen":7,"nodes":[{"id":true,"adapters":[{"capacty":1,"weight":"x","on":"yes"}]}],"queue":{"max":1.5}}`,
			Errors{
				`listen: want string, got JSON number 7`,
				`nodes[0].adapters[0].capacty: unknown field`,
				`nodes[0].adapters[0].on: want bool, got JSON string`,
				`nodes[0].adapters[0].weight: want a number, got JSON string`,
				`nodes[0].id: want string, got JSON bool`,
				`queue.max: want an integer that fits int, got JSON number 1.5`,
			}, false},
		{"range", `{"nodes":[{"adapters":[{"small":300,"count":-1}]}]}`,
			Errors{`nodes[0].adapters[0].count: want a non-negative integer that fits uint32, got JSON number -1`,
				`nodes[0].adapters[0].small: want an integer that fits int8, got JSON number 300`}, false},
		{"containers", `{"nodes":{"id":"a"},"queue":[1]}`,
			Errors{`nodes: want an array, got JSON object`, `queue: want an object, got JSON array`}, false},
		{"map values", `{"nodes":[{"labels":{"k":1}}]}`, Errors{`nodes[0].labels.k: want string, got JSON number 1`}, false},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var c testConfig
			errs, usable := Decode([]byte(row.json), &c)
			if usable != row.usable || !reflect.DeepEqual(errs, row.want) {
				t.Errorf("got %q usable=%v\nwant %q usable=%v", errs, usable, row.want, row.usable)
			}
		})
	}
}

// A type with its own decoder (time.Time: an RFC 3339 string) is left to
// it: its string is no type mismatch, and its own error is reported.
func TestDecodeLeavesUnmarshalersToThemselves(t *testing.T) {
	var c testConfig
	if errs, usable := Decode([]byte(`{"at":"2026-01-02T03:04:05Z"}`), &c); !usable || errs != nil {
		t.Fatalf("got %q usable=%v, want no error", errs, usable)
	}
	if want := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC); !c.At.Equal(want) {
		t.Fatalf("at = %v, want %v", c.At, want)
	}
	errs, usable := Decode([]byte(`{"at":"yesterday"}`), &c)
	if usable || len(errs) != 1 || !strings.Contains(errs[0], "yesterday") {
		t.Fatalf("got %q usable=%v, want one error naming the bad time", errs, usable)
	}
}
