package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge/config"
	"iop/internal/leakcheck"
)

// nodeIDs returns n node ids "n000", "n001", ….
func nodeIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("n%03d", i)
	}
	return ids
}

// fleetConfig is an Edge config for ids, each with one ollama adapter "o"
// at url, and one model "tiny" served by every node.
func fleetConfig(t testing.TB, p pkiDir, ids []string, url string) *config.Config {
	nodes := make([]config.Node, len(ids))
	cands := make([]config.ModelProvider, len(ids))
	for i, id := range ids {
		nodes[i] = config.Node{ID: id, Adapters: []config.Adapter{ollamaAdapter("o", url, 4)}}
		cands[i] = provider(id, "o", "tiny")
	}
	return edgeConfig(t, p, nodes, []config.Model{modelGroup("tiny", cands...)}, nil)
}

// waitFleet waits until /status shows want nodes connected.
func waitFleet(t testing.TB, adm *adminClient, want int, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("%d nodes connected", want), func() (bool, string) {
		d, err := adm.status()
		if err != nil {
			return false, err.Error()
		}
		return d.connected() == want, fmt.Sprintf("%d of %d connected", d.connected(), want)
	})
}

// TestEdgeRestartFiftyNodes (issue 3, S1, S2, L5): 50 in-process nodes with
// a 1 s reconnect interval ride out an Edge restart on the same node port:
// every one is ready again within one reconnect interval plus 2 s of the new
// Edge serving.
func TestEdgeRestartFiftyNodes(t *testing.T) {
	leakcheck.Check(t)
	const (
		fleet    = 50
		interval = time.Second
		bound    = interval + 2*time.Second
	)
	logs := newLogSink(t)
	ids := nodeIDs(fleet)
	p := newPKI(t, ids...)
	bp := startBackend(t, backend.Options{})
	url := bp.serve(t, nil)
	cfg := fleetConfig(t, p, ids, url)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nodeAddr := ln.Addr().String()
	e1 := startEdge(t, cfg, ln, logs.logger("edge"))
	adm1 := newAdminClient(t, e1)
	hc := newHTTPClient(t)
	secs := int(interval / time.Second)
	for _, id := range ids {
		startNode(t, p, id, nodeAddr, nodeOpts{intervalSec: &secs, client: hc, log: logs.logger("node")})
	}
	waitFleet(t, adm1, fleet, 20*time.Second)

	stopped := time.Now()
	if err := e1.stop(); err != nil {
		t.Fatalf("first edge: %v", err)
	}
	var ln2 net.Listener
	eventually(t, 5*time.Second, "listen again on "+nodeAddr, func() (bool, string) {
		var err error
		ln2, err = net.Listen("tcp", nodeAddr)
		return err == nil, fmt.Sprint(err)
	})
	e2 := startEdge(t, cfg, ln2, logs.logger("edge2"))
	serving := time.Now()
	adm2 := newAdminClient(t, e2)
	waitFleet(t, adm2, fleet, bound+5*time.Second)
	ready := time.Now()
	took := ready.Sub(serving)
	t.Logf("issue 3 figure: all %d nodes ready %v after the new Edge served (%v after the old one began stopping); bound %v",
		fleet, took.Round(time.Millisecond), ready.Sub(stopped).Round(time.Millisecond), bound)
	if took > bound {
		t.Errorf("S2: %d nodes took %v to be ready again, want ≤ %v (one reconnect interval + 2 s)", fleet, took, bound)
	}

	api := newAPIClient(t, e2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := api.chat(ctx, chatRequest{model: "tiny"})
	if err != nil || res.status != http.StatusOK || res.text != answer {
		t.Fatalf("request through the restarted Edge: err %v status %d body %s", err, res.status, res.raw)
	}
}
