package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/edge/surface"
	"iop/internal/leakcheck"
)

// unknownCase is one request with unknown members at several depths: the
// paths the report must name, in order.
type unknownCase struct {
	path, body string
	paths      []string
}

var unknownCases = []unknownCase{
	{"/v1/chat/completions", `{"model":"tiny","vendor_hint":1,"messages":[{"role":"user","content":[{"type":"text","text":"hi","x_part":{"a":1}}],"x_msg":true}],` +
		`"tools":[{"type":"function","x_tool":1,"function":{"name":"get_weather","x_fn":2,"parameters":{"type":"object"}}}]}`,
		[]string{"vendor_hint", "messages[0].content[0].x_part", "messages[0].x_msg", "tools[0].x_tool", "tools[0].function.x_fn"}},
	{"/v1/messages", `{"model":"tiny","max_tokens":16,"x_top":{"deep":[1]},"thinking":{"type":"adaptive","x_think":1},"messages":[{"role":"user","content":[{"type":"text","text":"hi","x_block":1}]}]}`,
		[]string{"x_top", "thinking.x_think", "messages[0].content[0].x_block"}},
	{"/v1/responses", `{"model":"tiny","x_top":1,"input":[{"type":"message","role":"user","x_item":1,"content":[{"type":"input_text","text":"hi","x_part":1}]}],` +
		`"tools":[{"type":"web_search"},` + weatherRespFn + `]}`,
		[]string{"x_top", "input[0].x_item", "input[0].content[0].x_part", "tools[0]"}},
}

// T5: under http.unknown_fields "report" (the default) unknown members at
// any depth are accepted, reach no backend, and are reported three ways:
// the Iop-Ignored-Fields response header, the access line's
// ignored_fields and iop_edge_ignored_fields_total (by the field-table
// row); an unknown content type is still a 400 naming it. Under "reject"
// the same requests are the 400s that name the first unknown member.
func TestUnknownFields(t *testing.T) {
	leakcheck.Check(t)
	for _, mode := range []string{"report", "reject"} {
		t.Run(mode, func(t *testing.T) {
			logs := newLogSink(t)
			p := newPKI(t, "gpu-1")
			bp := startBackend(t, backend.Options{})
			capt := &captor{next: bp.b}
			url := bp.serve(t, capt)
			cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", url, 4)}}},
				[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}, func(c *config.Config) { c.HTTP.UnknownFields = mode })
			_, adm, api := startReady(t, p, cfg, logs)
			for _, c := range unknownCases {
				capt.take()
				resp, err := api.hc.Post(api.url+c.path, "application/json", strings.NewReader(c.body))
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if mode == "reject" {
					if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), c.paths[0]) {
						t.Errorf("%s: got %d %.300s, want a 400 naming %q", c.path, resp.StatusCode, body, c.paths[0])
					}
					continue
				}
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s: got %d %.300s, want 200", c.path, resp.StatusCode, body)
				}
				if got, want := resp.Header.Get(surface.IgnoredHeader), strings.Join(c.paths, ", "); got != want {
					t.Errorf("%s: %s %q, want %q", c.path, surface.IgnoredHeader, got, want)
				}
				native := capt.take()
				for _, pth := range c.paths {
					key := pth[strings.LastIndexAny(pth, ".")+1:]
					if strings.HasPrefix(key, "x_") && bytes.Contains(native, []byte(`"`+key+`"`)) {
						t.Errorf("%s: the Ollama request carries %q: %s", c.path, key, native)
					}
				}
				logs.waitLine(t, "the access line's ignored_fields", "ignored_fields="+strings.Join(c.paths, ", "))
			}
			if mode == "report" {
				m, err := adm.metrics()
				if err != nil {
					t.Fatal(err)
				}
				for series, want := range map[string]float64{
					`iop_edge_ignored_fields_total{surface="chat_completions",field="top_level"}`: 1,
					`iop_edge_ignored_fields_total{surface="chat_completions",field="messages"}`:  2,
					`iop_edge_ignored_fields_total{surface="chat_completions",field="tools"}`:     2,
					`iop_edge_ignored_fields_total{surface="messages",field="thinking"}`:          1,
					`iop_edge_ignored_fields_total{surface="responses",field="tools"}`:            1,
				} {
					if m[series] != want {
						t.Errorf("%s = %v, want %v", series, m[series], want)
					}
				}
			}
			// Under both: an unknown content type is a 400 naming it.
			status, body := api.postRaw(t, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":[{"type":"hologram"}]}]}`)
			var e struct {
				Error struct{ Message string } `json:"error"`
			}
			_ = json.Unmarshal([]byte(body), &e)
			if status != http.StatusBadRequest || !strings.Contains(e.Error.Message, "hologram") {
				t.Errorf("unknown content type: got %d %s, want a 400 naming it", status, body)
			}
		})
	}
}
