package api

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"iop/internal/edge/config"
	"iop/internal/leakcheck"
	"iop/internal/proctest"
	"iop/internal/protocol"
)

// B4: a request head past http.max_header_fields or http.max_header_bytes
// gets 431, with the connection closed, before authentication (a request
// without a key within both bounds gets its 401), and each is counted in
// iop_edge_header_refusals_total by bound — a head so large that net/http
// refuses it itself, before any handler, too. 20,000 header fields get
// 431 under the default bounds and under a byte bound that lets them
// through to the field count.
func TestHeaderBounds(t *testing.T) {
	fieldLines := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "X-F%d: 1\r\n", i)
		}
		return b.String()
	}
	long := func(n int) string { return "X-Long: " + strings.Repeat("a", n) + "\r\n" }
	cases := []struct {
		name        string
		maxBytes    int // http.max_header_bytes; 0 = default
		lines       string
		status      int
		bytes, flds int64 // the counts after it
		inBody      string
	}{
		{name: "B4 within the bounds: authentication answers", lines: fieldLines(200), status: 401},
		// Host, Content-Type and Content-Length are three of the fields.
		{name: "B4 256 fields: at the field bound", lines: fieldLines(253), status: 401},
		{name: "B4 257 fields: 431 by count", lines: fieldLines(254), status: 431, flds: 1, inBody: "257 header fields, more than http.max_header_fields (256)"},
		{name: "B4 20,000 fields, default bounds: 431 (net/http, by bytes)", lines: fieldLines(20000), status: 431, bytes: 1},
		{name: "B4 20,000 fields within a 1 MiB byte bound: 431 by count", maxBytes: 1 << 20, lines: fieldLines(20000), status: 431, flds: 1,
			inBody: "20003 header fields"},
		{name: "B4 a 65 KiB field: 431 by bytes (the handler)", lines: long(65 << 10), status: 431, bytes: 1, inBody: "more than http.max_header_bytes (65536)"},
		{name: "B4 a 200 KiB field: 431 by bytes (net/http itself)", lines: long(200 << 10), status: 431, bytes: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			cfg := testConfig(map[string]string{"team-a": "sk-secret-a"})
			if tc.maxBytes > 0 {
				cfg.HTTP.MaxHeaderBytes = tc.maxBytes
			}
			h := New(Options{Config: func() *config.Config { return cfg }, Pool: newFakePool(protocol.TypeOllama),
				Dispatcher: newFakeDispatcher(newFakeStream("run-1")), Now: fixedNow, NewID: seqIDs(),
				Logger: slog.New(slog.NewTextHandler(&proctest.Log{}, nil))})
			srv := httptest.NewUnstartedServer(h)
			srv.Listener = h.Listener(srv.Listener)
			srv.Config.MaxHeaderBytes = MaxHeaderBytes(cfg)
			srv.Start()
			defer srv.Close()
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			go func() { // the server may answer before it has read it all
				_, _ = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n"+
					"Content-Length: 2\r\n"+tc.lines+"\r\n{}")
			}()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.inBody) {
				t.Fatalf("B4: %d %s; want %d with %q", resp.StatusCode, body, tc.status, tc.inBody)
			}
			if tc.status == 431 && !resp.Close {
				t.Errorf("B4: the connection stays open after a 431")
			}
			samples := h.headers.metric().Samples()
			if got := [2]int64{int64(samples[`bound="bytes"`]), int64(samples[`bound="fields"`])}; got != [2]int64{tc.bytes, tc.flds} {
				t.Errorf("B4: %s bytes/fields = %v, want %v", MetricHeaderRefusals, got, [2]int64{tc.bytes, tc.flds})
			}
		})
	}
}
