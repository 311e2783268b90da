package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// B4, through the edge as it runs: 20,000 request header fields get 431
// before authentication (not the 401 of a keyless request), so do 300,
// and /metrics counts each under its bound.
func TestHeaderBoundsThroughTheEdge(t *testing.T) {
	leakcheck.Check(t)
	logs := newLogSink(t)
	p := newPKI(t, "gpu-1")
	cfg := edgeConfig(t, p, []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{ollamaAdapter("ollama", "http://127.0.0.1:9", 1)}}},
		[]config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny"))}, func(c *config.Config) {
			c.APIKeys = []config.APIKey{{Principal: "team-a", KeySHA256: strings.Repeat("ab", 32)}}
		})
	e := startEdge(t, cfg, nil, logs.logger("edge"))
	adm := newAdminClient(t, e)
	u, _ := url.Parse(e.httpURL)
	send := func(fields int) int {
		t.Helper()
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func() {
			var b strings.Builder
			b.WriteString("POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nContent-Length: 2\r\n")
			for i := range fields {
				fmt.Fprintf(&b, "X-F%d: 1\r\n", i)
			}
			b.WriteString("\r\n{}")
			_, _ = io.WriteString(c, b.String())
		}()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct{ fields, want int }{{10, 401}, {20000, 431}, {300, 431}} {
		if got := send(tc.fields); got != tc.want {
			t.Errorf("B4: %d header fields got %d, want %d", tc.fields, got, tc.want)
		}
	}
	m, err := adm.metrics()
	if err != nil {
		t.Fatal(err)
	}
	if b, f := m[`iop_edge_header_refusals_total{bound="bytes"}`], m[`iop_edge_header_refusals_total{bound="fields"}`]; b != 1 || f != 1 {
		t.Errorf("B4: iop_edge_header_refusals_total bytes %v, fields %v; want 1 and 1", b, f)
	}
}
