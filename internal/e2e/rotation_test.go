package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/demo/backend"
	"iop/internal/edge"
	"iop/internal/edge/config"
	"iop/internal/identity"
	"iop/internal/leakcheck"
	"iop/internal/node"
	nodeconfig "iop/internal/node/config"
)

// startCredNodeTrusting runs node id with its lease keys, trusting the
// issuer public keys in files (the node config's issuer_public_keys); the
// caller stops it.
func (k *credKit) startCredNodeTrusting(t *testing.T, id, edgeAddr string, files ...string) *nodeProc {
	t.Helper()
	cfg, err := nodeConfigFor(k.p, id, edgeAddr, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Credentials = nodeconfig.Credentials{RecipientPrivateKeyFile: k.p.file(identity.RecipientKeyFileName(id))}
	for _, f := range files {
		cfg.Credentials.IssuerPublicKeys = append(cfg.Credentials.IssuerPublicKeys, k.p.file(f))
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &nodeProc{id: id, cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- node.Run(ctx, cfg, node.Options{Version: "e2e"}) }()
	t.Cleanup(func() { n.stop() })
	return n
}

// C3 (issuer key rotation with overlap): the documented order of steps
// (docs/operating.md, "Rotating the lease issuer key") runs while a client
// sends requests without pause, and not one request fails:
//
//  1. `edge pki issuer -name issuer-2` makes the new pair;
//  2. a reload naming the new key while the node trusts only the old one
//     is refused (the node would refuse every lease) and the edge keeps
//     signing with the old key;
//  3. the nodes are restarted, one at a time, trusting both keys;
//  4. the edge's issuer_key_file names the new key and it reloads: new
//     leases are signed with it, the nodes' refreshed payloads name it;
//  5. the nodes are restarted, one at a time, trusting only the new key.
//
// Each node restart is a graceful stop (drain) and a start, while the
// other node of the model groups takes the new work (a request the
// draining node refuses before its first byte goes to the other), as
// docs/operating.md says to take a node out without losing a request.
func TestIssuerKeyRotation(t *testing.T) {
	leakcheck.Check(t)
	p := newPKI(t, "gpu-1", "gpu-2")
	k := newCredKit(t, p, "sk-rotate-issuer-0000")
	if err := identity.NewIssuer(string(p), "issuer-2", false); err != nil {
		t.Fatal(err)
	}
	bp := startBackend(t, backend.Options{})
	url := bp.serve(t, nil)
	var nodes []config.Node
	for _, id := range []string{"gpu-1", "gpu-2"} {
		nodes = append(nodes, config.Node{ID: id, Adapters: []config.Adapter{compatAdapter("llama", url, 8), ollamaAdapter("ollama", url, 8)}})
	}
	models := []config.Model{
		modelGroup("tiny-oa", provider("gpu-1", "llama", "tiny"), provider("gpu-2", "llama", "tiny")),
		modelGroup("tiny", provider("gpu-1", "ollama", "tiny"), provider("gpu-2", "ollama", "tiny")),
	}
	withIssuer := func(file string) *config.Config {
		return edgeConfig(t, p, nodes, models, func(c *config.Config) {
			k.tweak(t)(c)
			c.Credentials.IssuerKeyFile = p.file(file)
			for i := range c.Nodes {
				pub, err := identity.LoadRecipientPublicKey(p.file(identity.RecipientPubFileName(c.Nodes[i].ID)))
				if err != nil {
					t.Fatal(err)
				}
				c.Nodes[i].LeaseRecipientPublicKey = identity.RecipientPublicKeyBase64(pub)
			}
		})
	}
	logs := newLogSink(t)
	reload := make(chan *config.Config)
	e := startEdge(t, withIssuer(identity.IssuerKeyFile), nil, logs.logger("edge"), func(o *edge.Options) { o.Reload = reload })
	adm, api := newAdminClient(t, e), newAPIClient(t, e)
	running := map[string]*nodeProc{}
	for _, id := range []string{"gpu-1", "gpu-2"} {
		running[id] = k.startCredNodeTrusting(t, id, e.nodeAddr, identity.IssuerPubFile)
		adm.waitConnected(t, 10*time.Second, id)
	}

	var sent, failed atomic.Int64
	var mu sync.Mutex
	var failures []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				r := chatRequest{model: []string{"tiny-oa", "tiny"}[(i+j)%2], stream: j%3 == 0}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				res, err := api.chat(ctx, r)
				cancel()
				sent.Add(1)
				if err != nil || res.status != 200 || res.text != answer {
					failed.Add(1)
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s stream=%v: %d %v %.200s", r.model, r.stream, res.status, err, res.raw))
					mu.Unlock()
				}
			}
		}()
	}
	served := func(step string) {
		t.Helper()
		before := sent.Load()
		eventually(t, 20*time.Second, step+": requests keep being served", func() (bool, string) {
			return sent.Load() >= before+10, fmt.Sprintf("%d sent", sent.Load()-before)
		})
	}
	restart := func(step string, files ...string) {
		t.Helper()
		for _, id := range []string{"gpu-1", "gpu-2"} {
			if err := running[id].stop(); err != nil {
				t.Fatalf("%s: %s stop: %v", step, id, err)
			}
			running[id] = k.startCredNodeTrusting(t, id, e.nodeAddr, files...)
			adm.waitConnected(t, 10*time.Second, id)
			served(step + ", " + id + " restarted")
		}
	}
	served("before")

	// 2. The new key while the node trusts only the old one: refused.
	rejected := logs.messages("config reload rejected; keeping the running config")
	reload <- withIssuer("issuer-2.key")
	eventually(t, 10*time.Second, "the reload is refused", func() (bool, string) {
		return logs.messages("config reload rejected; keeping the running config") > rejected, "not yet"
	})
	served("after the refused reload")

	// 3. The node trusts both keys.
	restart("node trusts old and new", identity.IssuerPubFile, "issuer-2.pub")

	// 4. The edge switches to the new key.
	reloaded := logs.messages("config reloaded")
	reload <- withIssuer("issuer-2.key")
	eventually(t, 10*time.Second, "the edge switches to the new key", func() (bool, string) {
		return logs.messages("config reloaded") > reloaded, "not reloaded yet"
	})
	served("edge signs with the new key")

	// 5. The node trusts only the new key.
	restart("node trusts only the new key", "issuer-2.pub")

	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if failed.Load() != 0 {
		t.Fatalf("C3: %d of %d requests failed during the rotation; first: %v", failed.Load(), sent.Load(), failures[0])
	}
	t.Logf("%d requests, none failed", sent.Load())
}
