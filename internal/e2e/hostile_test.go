package e2e

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/identity"
	"iop/internal/leakcheck"
	"iop/internal/wire"
	iop "iop/proto/gen/iop"
)

// rawNode is a node that speaks the wire protocol by hand, so a test can
// make it break the protocol: it registers, says ready, and then answers
// each run or tunnel with the envelopes the test gives it.
type rawNode struct {
	conn *tls.Conn
	r    *wire.Reader
	w    *wire.Writer
}

// dialRawNode connects as node id to the Edge at addr and completes
// register and ready (SPEC L3, L5).
func dialRawNode(t *testing.T, p pkiDir, id, addr string) *rawNode {
	t.Helper()
	tc, err := identity.ClientConfig(identity.ClientOptions{
		CertFile: p.file(identity.CertFileName(id)), KeyFile: p.file(identity.KeyFileName(id)), CAFile: p.file(identity.CACertFile),
		ExpectedEdgeName: edgeName, NodeName: id,
	})
	if err != nil {
		t.Fatal(err)
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, tc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	n := &rawNode{conn: conn, r: wire.NewReader(conn, wire.DefaultMaxFrame), w: wire.NewWriter(conn, wire.DefaultMaxFrame)}
	n.send(t, &iop.Envelope{Kind: &iop.Envelope_RegisterRequest{RegisterRequest: &iop.RegisterRequest{NodeId: id}}})
	if env := n.next(t); !env.GetRegisterResponse().GetAccepted() {
		t.Fatalf("registration: %v", env)
	}
	n.send(t, &iop.Envelope{Kind: &iop.Envelope_ReadyRequest{ReadyRequest: &iop.NodeReadyRequest{NodeId: id}}})
	if env := n.next(t); !env.GetReadyResponse().GetReady() {
		t.Fatalf("ready: %v", env)
	}
	return n
}

func (n *rawNode) send(t *testing.T, env *iop.Envelope) {
	t.Helper()
	n.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := n.w.WriteEnvelope(env); err != nil {
		t.Fatalf("node write: %v", err)
	}
}

// next returns the next envelope that is not a heartbeat, within 10 s.
func (n *rawNode) next(t *testing.T) *iop.Envelope {
	t.Helper()
	n.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		env := new(iop.Envelope)
		if err := n.r.ReadEnvelope(env); err != nil {
			t.Fatalf("node read: %v", err)
		}
		if env.GetPing() == nil && env.GetPong() == nil {
			return env
		}
	}
}

func ev(seq uint64, typ iop.RunEventType, text string) *iop.Envelope {
	e := &iop.RunEvent{Seq: seq, Type: typ, Delta: text}
	if typ == iop.RunEventType_RUN_EVENT_COMPLETE {
		e.Delta, e.Content, e.FinishReason = "", text, "stop"
	}
	return &iop.Envelope{Kind: &iop.Envelope_RunEvent{RunEvent: e}}
}

func fr(seq uint64, kind iop.TunnelFrameKind, body string) *iop.Envelope {
	f := &iop.ProviderTunnelFrame{Seq: seq, Kind: kind, Body: []byte(body)}
	if kind == iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START {
		f.Body, f.Status = nil, 200
		f.Headers = []*iop.Header{{Name: "Content-Type", Value: "text/event-stream"}}
	}
	return &iop.Envelope{Kind: &iop.Envelope_TunnelFrame{TunnelFrame: f}}
}

// B1, SPEC E3, T2: a node that breaks a stream's order fails that
// run with a protocol error logged with the node and generation; the node
// gets CancelRequest{protocol_error}; the client gets an error (502 before
// any byte, an error event after) and never the misordered content. Content
// after a terminal is dropped and logged.
func TestMisorderedEventsNeverReachTheClient(t *testing.T) {
	const (
		start    = iop.RunEventType_RUN_EVENT_START
		delta    = iop.RunEventType_RUN_EVENT_DELTA
		complete = iop.RunEventType_RUN_EVENT_COMPLETE
		rstart   = iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START
		body     = iop.TunnelFrameKind_TUNNEL_FRAME_BODY
		end      = iop.TunnelFrameKind_TUNNEL_FRAME_END
	)
	rows := []struct {
		name       string
		model      string
		envs       []*iop.Envelope
		wantStatus int
		wantText   string // what the client may see of the content
		wantError  bool   // an error reaches the client
		wantLog    string
		wantCancel bool
	}{
		{"E3 DELTA before START", "tiny", []*iop.Envelope{ev(1, delta, "EVIL")},
			502, "", true, "stream out of order", true},
		{"E3 seq going backwards", "tiny", []*iop.Envelope{ev(1, start, ""), ev(2, delta, "ok "), ev(2, delta, "EVIL"), ev(3, complete, "ok EVIL")},
			200, "ok ", true, "stream out of order", true},
		{"E3 START after a DELTA", "tiny", []*iop.Envelope{ev(1, start, ""), ev(2, delta, "ok "), ev(3, start, ""), ev(4, delta, "EVIL")},
			200, "ok ", true, "stream out of order", true},
		{"E3 anything after a terminal", "tiny", []*iop.Envelope{ev(1, start, ""), ev(2, delta, "ok"), ev(3, complete, "ok"), ev(4, delta, "EVIL")},
			200, "ok", false, "frame after the stream's terminal", false},
		{"T2 BODY seq going backwards", "tiny-oa", []*iop.Envelope{fr(1, rstart, ""), fr(2, body, "data: {\"ok\":1}\n\n"),
			fr(1, body, "data: {\"EVIL\":1}\n\n"), fr(3, end, "")},
			200, `{"ok":1}`, true, "stream out of order", true},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			p := newPKI(t, "gpu-1")
			logs := newLogSink(t)
			nodes := []config.Node{{ID: "gpu-1", Adapters: []config.Adapter{
				ollamaAdapter("ollama", "http://127.0.0.1:9", 4), compatAdapter("llama", "http://127.0.0.1:9", 4)}}}
			models := []config.Model{modelGroup("tiny", provider("gpu-1", "ollama", "tiny")),
				modelGroup("tiny-oa", provider("gpu-1", "llama", "tiny"))}
			e := startEdge(t, edgeConfig(t, p, nodes, models, nil), nil, logs.logger("edge"))
			adm, api := newAdminClient(t, e), newAPIClient(t, e)
			n := dialRawNode(t, p, "gpu-1", e.nodeAddr)
			adm.waitConnected(t, 10*time.Second, "gpu-1")

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			type answer struct {
				status int
				raw    string
				err    error
			}
			done := make(chan answer, 1)
			go func() {
				resp, err := api.post(ctx, chatRequest{model: row.model, stream: true})
				if err != nil {
					done <- answer{err: err}
					return
				}
				defer resp.Body.Close()
				raw, err := io.ReadAll(resp.Body)
				done <- answer{resp.StatusCode, string(raw), err}
			}()
			req := n.next(t)
			if req.GetRunRequest() == nil && req.GetTunnelRequest() == nil {
				t.Fatalf("node got %v, want a run or tunnel", req)
			}
			for _, env := range row.envs {
				env.RunId = req.GetRunId()
				n.send(t, env)
			}
			if row.wantCancel {
				if env := n.next(t); env.GetCancelRequest().GetReason() != "protocol_error" || env.GetRunId() != req.GetRunId() {
					t.Fatalf("node got %v, want CancelRequest{protocol_error} for %s", env, req.GetRunId())
				}
			}
			a := <-done
			if a.err != nil {
				t.Fatal(a.err)
			}
			if a.status != row.wantStatus {
				t.Fatalf("status: got %d, want %d; body %s", a.status, row.wantStatus, a.raw)
			}
			if strings.Contains(a.raw, "EVIL") {
				t.Fatalf("misordered content reached the client:\n%s", a.raw)
			}
			var text string
			if a.status == 200 {
				res := chatResult{status: a.status}
				if row.model == "tiny" {
					if err := parseStream(&res, []byte(a.raw)); err != nil {
						t.Fatal(err)
					}
					text = res.text
				} else if data := sseData([]byte(a.raw)); len(data) > 0 {
					text = data[0]
				}
				if errEvent := strings.Contains(a.raw, `"error"`); errEvent != row.wantError {
					t.Fatalf("error event: got %v, want %v:\n%s", errEvent, row.wantError, a.raw)
				}
			} else if !strings.Contains(a.raw, "provider_protocol_error") {
				t.Fatalf("want code provider_protocol_error, got %s", a.raw)
			}
			if text != row.wantText {
				t.Fatalf("client content: got %q, want %q", text, row.wantText)
			}
			line, err := logs.recs.waitFor(5*time.Second, func(ls []string) bool {
				for _, l := range ls {
					if strings.Contains(l, row.wantLog) {
						return true
					}
				}
				return false
			})
			if err != nil {
				t.Fatalf("no %q log line: %v", row.wantLog, err)
			}
			for _, l := range line {
				if strings.Contains(l, row.wantLog) && (!strings.Contains(l, "node=gpu-1") || !strings.Contains(l, "generation=1")) {
					t.Errorf("log line without node and generation: %s", l)
				}
			}
		})
	}
}
