package fleet

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/identity"
	"iop/internal/leakcheck"
	iop "iop/proto/gen/iop"
)

func report(adapters ...*iop.AdapterModels) *iop.NodeModelsReport {
	return &iop.NodeModelsReport{Adapters: adapters}
}

// D1 D2: what a node reports is cleaned and bounded before the edge keeps
// it: only the adapters the config asks it to discover, so a hostile
// node's made-up adapters cost nothing; a failed listing keeps the last
// list; an older generation is ignored; a fenced node's models go;
// Changed fires only on a change, and the line it logs is rate limited.
func TestReport(t *testing.T) {
	e := newEdgeEnv(t, func(raw map[string]any) {
		raw["node_templates"] = []any{map[string]any{"match": "gpu-*", "adapters": []any{
			map[string]any{"type": "ollama", "base_url": "http://127.0.0.1:11434"},
			map[string]any{"name": "quiet", "type": "ollama", "base_url": "http://127.0.0.1:11435"}}}}
		raw["model_discovery"] = []any{map[string]any{"node": "gpu-*", "provider": "ollama"}}
	})
	drain := func() int {
		n := 0
		for {
			select {
			case <-e.changed:
				n++
			default:
				return n
			}
		}
	}
	f := e.f
	if !f.Report("gpu-3", 1, report(&iop.AdapterModels{Adapter: "ollama",
		Models: []string{"tiny:latest", "b", "tiny:latest", "", "bad\x00name", strings.Repeat("x", MaxModelName+1), "a\xff"}})) {
		t.Fatal("D1 a first report is a change")
	}
	_, _, disc := f.Inputs()
	if got := disc["gpu-3"]["ollama"]; !slices.Equal(got, []string{"b", "tiny:latest"}) {
		t.Fatalf("D2 cleaned list %q, want [b tiny:latest]", got)
	}
	if drain() != 1 {
		t.Error("D2 Changed not called once for the first report")
	}
	if f.Report("gpu-3", 1, report(&iop.AdapterModels{Adapter: "ollama", Models: []string{"tiny:latest", "b"}})) || drain() != 0 {
		t.Error("D2 the same list again counts as a change")
	}
	if f.Report("gpu-3", 1, report(&iop.AdapterModels{Adapter: "ollama", Error: "connection refused"})) {
		t.Error("D2 a failed listing changed the models")
	}
	if _, _, disc := f.Inputs(); len(disc["gpu-3"]["ollama"]) != 2 {
		t.Error("D2 a failed listing dropped the models")
	}
	if f.Report("gpu-3", 0, report(&iop.AdapterModels{Adapter: "ollama", Models: []string{"old"}})) {
		t.Error("L9 a report of an older generation was taken")
	}
	many := make([]string, 10000)
	for i := range many {
		many[i] = fmt.Sprintf("m%05d", i)
	}
	ads := []*iop.AdapterModels{{Adapter: "ollama", Models: many}, {Adapter: "quiet", Models: many}}
	for i := range 100 {
		ads = append(ads, &iop.AdapterModels{Adapter: fmt.Sprintf("a%d", i), Models: many})
	}
	f.Report("gpu-4", 1, report(ads...))
	_, _, disc = f.Inputs()
	if got := disc["gpu-4"]; len(got) != 1 || len(got["ollama"]) != MaxAdapterModels {
		kept := map[string]int{}
		for a, ms := range got {
			kept[a] = len(ms)
		}
		t.Errorf("D2 a hostile report kept %v, want only adapter ollama (the one discovery asks for) cut to %d models", kept, MaxAdapterModels)
	}
	drain()
	before := strings.Count(e.log.String(), "node models")
	for i := range 100 { // a node that reports a new list as fast as it can
		f.Report("gpu-5", 1, report(&iop.AdapterModels{Adapter: "ollama", Models: []string{fmt.Sprint(i)}}))
		drain()
	}
	if n := strings.Count(e.log.String(), "node models") - before; n == 0 || n > 20 {
		t.Errorf("D2 100 changed reports in a moment logged %d lines, want a few (rate limited)", n)
	}
	drain()
	f.NodeFenced("gpu-3", 1)
	if _, _, disc := f.Inputs(); disc["gpu-3"] != nil || drain() != 1 {
		t.Error("D2 a fenced node's models stayed, or no change was announced")
	}
	f.Report("gpu-3", 2, report(&iop.AdapterModels{Adapter: "ollama", Models: []string{"tiny:latest"}}))
	f.NodeFenced("gpu-3", 1) // the fence of an older generation
	if _, _, disc := f.Inputs(); disc["gpu-3"] == nil {
		t.Error("L9 the fence of an older generation dropped a newer one's models")
	}
}

// D2, L8: a models report of a generation that a takeover fenced is never
// kept: its session's read loop checked that the generation was current,
// then the takeover fenced it before the report was stored. Whichever of
// the two comes first — in order, and raced — no model of the fenced
// generation stays, while the next generation's report is kept.
func TestD2ReportRacingAFenceNotKept(t *testing.T) {
	e := newEdgeEnv(t, func(raw map[string]any) {
		raw["node_templates"] = []any{map[string]any{"match": "gpu-*", "adapters": []any{
			map[string]any{"type": "ollama", "base_url": "http://127.0.0.1:11434"}}}}
		raw["model_discovery"] = []any{map[string]any{"node": "gpu-*", "provider": "ollama"}}
	})
	stop, drained := make(chan struct{}), make(chan struct{})
	go func() { // Changed may fire from any of the goroutines below
		defer close(drained)
		for {
			select {
			case <-e.changed:
			case <-stop:
				return
			}
		}
	}()
	defer func() { close(stop); <-drained }()
	f := e.f
	models := report(&iop.AdapterModels{Adapter: "ollama", Models: []string{"tiny:latest"}})
	kept := func(node string) bool {
		_, _, disc := f.Inputs()
		_, inStatus := f.Discovered()[node]
		return disc[node] != nil || inStatus
	}
	f.NodeFenced("gpu-1", 1)
	if f.Report("gpu-1", 1, models) || kept("gpu-1") {
		t.Fatal("D2: a report of generation 1 stored after its fence was kept")
	}
	if !f.Report("gpu-1", 2, models) || !kept("gpu-1") {
		t.Fatal("D2: the next generation's report after the fence was not kept")
	}
	f.Report("gpu-2", 1, models)
	f.NodeFenced("gpu-2", 1)
	if kept("gpu-2") {
		t.Fatal("D2: a report of generation 1 stayed after its fence")
	}
	const nodes = 200
	start := make(chan struct{})
	done := make(chan struct{})
	for i := range nodes {
		node := fmt.Sprintf("gpu-r%d", i)
		for _, fn := range []func(){
			func() { f.Report(node, 1, models) }, // the read loop, past its current check
			func() { f.NodeFenced(node, 1) },     // the takeover's fence
		} {
			go func() {
				<-start
				fn()
				done <- struct{}{}
			}()
		}
	}
	close(start)
	for range 2 * nodes {
		<-done
	}
	left := 0
	for i := range nodes {
		if kept(fmt.Sprintf("gpu-r%d", i)) {
			left++
		}
	}
	if left != 0 {
		t.Fatalf("D2: %d of %d nodes kept a fenced generation's models after a report raced its fence", left, nodes)
	}
}

// J6: a revocation written by another process (edge nodes revoke) reaches
// the fleet within its watch interval: Changed fires, the node is no longer
// enrolled, and its certificate is refused at the handshake.
func TestWatchRevocation(t *testing.T) {
	leakcheck.Check(t)
	e := newEdgeEnv(t, nil)
	tok := e.token(t, nil)
	resp, err := join(t, e.addr, tok.Pin, joinReq(t, tok, "gpu-3", "gpu-3"))
	if err != nil || !resp.GetOk() {
		t.Fatalf("join: %v %v", resp, err)
	}
	cert, _ := identity.ParseCertificatePEM(resp.GetCertificatePem())
	id := identity.ID{TrustDomain: "iop.local", Role: identity.RoleNode, Name: "gpu-3"}
	for len(e.changed) > 0 {
		<-e.changed
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	e.f.o.WatchInterval = 20 * time.Millisecond
	go func() { defer close(done); e.f.Watch(stop) }()
	defer func() { close(stop); <-done }()
	if err := Update(e.store, func(st *Store) error { st.RevokeNode("gpu-3", time.Now()); return nil }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.changed:
	case <-time.After(5 * time.Second):
		t.Fatal("J6 the revocation was not noticed")
	}
	enrolled, revoked, _ := e.f.Inputs()
	if len(enrolled) != 0 || !revoked["gpu-3"] {
		t.Errorf("J6 after the revocation: enrolled %v, revoked %v", enrolled, revoked)
	}
	if !strings.Contains(e.log.String(), "node revoked: disconnecting it") || !strings.Contains(e.log.String(), "node=gpu-3") {
		t.Errorf("J6 the edge's log does not say the node was revoked:\n%s", e.log.String())
	}
	if err := e.f.Admit(id, cert); !errors.Is(err, ErrNodeRevoked) {
		t.Errorf("J6 handshake check: got %v, want ErrNodeRevoked", err)
	}
	if r := e.f.Renew("gpu-3", cert, &iop.CertificateRenewRequest{Csr: joinReq(t, tok, "gpu-3", "gpu-3").Csr}); r.GetOk() ||
		!strings.Contains(r.GetError(), "revoked") {
		t.Errorf("J6 renewal after revocation: %v", r)
	}
}

// J5: a renewal signs a new certificate for a new key, keeps the serial it
// replaces, and is refused for a CSR of another name or too soon again.
func TestRenew(t *testing.T) {
	e := newEdgeEnv(t, nil)
	tok := e.token(t, nil)
	resp, err := join(t, e.addr, tok.Pin, joinReq(t, tok, "gpu-3", "gpu-3"))
	if err != nil || !resp.GetOk() {
		t.Fatalf("join: %v %v", resp, err)
	}
	old, _ := identity.ParseCertificatePEM(resp.GetCertificatePem())
	csr := func(name string) []byte { return joinReq(t, tok, name, name).Csr }
	if r := e.f.Renew("gpu-3", old, &iop.CertificateRenewRequest{Csr: csr("gpu-4")}); r.GetOk() || !strings.Contains(r.GetError(), "asks for") {
		t.Fatalf("J2 a renewal CSR for another name: %v", r)
	}
	r := e.f.Renew("gpu-3", old, &iop.CertificateRenewRequest{Csr: csr("gpu-3")})
	if !r.GetOk() {
		t.Fatalf("J5 renewal: %v", r.GetError())
	}
	renewed, _ := identity.ParseCertificatePEM(r.GetCertificatePem())
	id := identity.ID{TrustDomain: "iop.local", Role: identity.RoleNode, Name: "gpu-3"}
	for name, c := range map[string]*x509.Certificate{"renewed": renewed, "replaced": old} {
		if err := e.f.Admit(id, c); err != nil {
			t.Errorf("J5 the %s certificate is refused: %v", name, err)
		}
	}
	if r := e.f.Renew("gpu-3", renewed, &iop.CertificateRenewRequest{Csr: csr("gpu-3")}); r.GetOk() || !strings.Contains(r.GetError(), "too recently") {
		t.Errorf("J5 an immediate second renewal: %v", r)
	}
}

// J1: a store file that group or others may write is refused by name and
// mode (its writer could add a token whose secret they know), by the
// running edge too, which keeps the last store read; one they may only
// read is taken (it holds secrets only hashed).
func TestStoreFileMode(t *testing.T) {
	e := newEdgeEnv(t, nil)
	if err := Update(e.store, func(st *Store) error { st.RevokeNode("gpu-3", time.Now()); return nil }); err != nil {
		t.Fatal(err)
	}
	if !e.f.reread() {
		t.Fatal("the revocation was not read")
	}
	for _, tt := range []struct {
		mode    os.FileMode
		refused bool
	}{{0o600, false}, {0o644, false}, {0o640, false}, {0o620, true}, {0o602, true}, {0o666, true}} {
		if err := os.Chmod(e.store, tt.mode); err != nil {
			t.Fatal(err)
		}
		_, err := LoadStore(e.store)
		if got := err != nil; got != tt.refused {
			t.Errorf("J1 mode %v: LoadStore error %v, want refused=%v", tt.mode, err, tt.refused)
		}
		if tt.refused && (!errors.Is(err, ErrBadStore) || !strings.Contains(err.Error(), "chmod 600") || !strings.Contains(err.Error(), e.store)) {
			t.Errorf("J1 mode %v: %v does not name the file and the fix", tt.mode, err)
		}
	}
	// A writer changes the file's time (a chmod alone does not, and is
	// seen at the next write).
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(e.store, later, later); err != nil {
		t.Fatal(err)
	}
	if e.f.reread() {
		t.Error("J1 the edge took a store others may write")
	}
	if _, revoked, _ := e.f.Inputs(); !revoked["gpu-3"] {
		t.Error("J1 a refused store dropped the revocation the edge had read")
	}
	if !strings.Contains(e.log.String(), "lets group or others write it") {
		t.Errorf("J1 the edge did not log why it refused the store: %s", e.log.String())
	}
}

// J6: a store file that does not parse (a hand edit cut short) keeps the
// last store read and is reported once per change of the file, not at
// every look (four lines a second for as long as it stays broken); a good
// file is taken again at once.
func TestWatchBadStore(t *testing.T) {
	e := newEdgeEnv(t, nil)
	if err := os.WriteFile(e.store, []byte(`{"version": 1, "tokens": [`), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if e.f.reread() {
			t.Fatal("J6 a broken store changed the inputs")
		}
	}
	if n := strings.Count(e.log.String(), "enrollment store unreadable"); n != 1 {
		t.Errorf("J6 five looks at one broken store logged %d lines, want 1", n)
	}
	if err := Update(e.store, func(st *Store) error { st.RevokeNode("gpu-3", time.Now()); return nil }); err == nil {
		t.Fatal("an update of a broken store succeeded")
	}
	if err := os.WriteFile(e.store, []byte(`{"version": 1, "tokens": [], "nodes": [{"name": "gpu-3", "serials": [], "not_after": "2026-01-01T00:00:00Z", "enrolled_at": "2026-01-01T00:00:00Z", "revoked_at": "2026-01-01T00:00:00Z"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if !e.f.reread() {
		t.Fatal("J6 the repaired store was not taken")
	}
	if _, revoked, _ := e.f.Inputs(); !revoked["gpu-3"] {
		t.Error("J6 the repaired store's revocation is not in effect")
	}
}
