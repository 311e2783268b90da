package api

import (
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"iop/internal/edge/config"
	"iop/internal/edge/creds"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// fakeCredentials issues a fixed lease, or fails with err, and records the
// requests.
type fakeCredentials struct {
	mu   sync.Mutex
	reqs []creds.Request
	err  error
}

func (c *fakeCredentials) Lease(r creds.Request) (*iop.CredentialLease, *iop.CredentialLeaseBinding, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reqs = append(c.reqs, r)
	if c.err != nil {
		return nil, nil, c.err
	}
	return &iop.CredentialLease{LeaseId: "lease-" + r.Provider}, &iop.CredentialLeaseBinding{NodeId: r.Node, Route: r.Model}, nil
}

// newCredRig is newRig with Options.Credentials set.
func newCredRig(t *testing.T, typ string, c Credentials) *rig {
	t.Helper()
	r := &rig{fp: newFakePool(typ), st: newFakeStream("run-1"), cfg: testConfig(map[string]string{"team-a": "k-a"})}
	r.p = r.fp
	r.d = newFakeDispatcher(r.st)
	cfg := r.cfg
	r.h = New(Options{Config: func() *config.Config { return cfg }, Pool: r.p, Dispatcher: r.d, Now: fixedNow, NewID: seqIDs(),
		Credentials: c})
	r.srv = httptest.NewServer(r.h)
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.srv.Client().CloseIdleConnections)
	t.Cleanup(r.st.kill)
	return r
}

// C2: after provider selection, runs and tunnels carry the lease issued for
// exactly the selected node, provider and target, the client's model and
// principal.
func TestCredentialAttached(t *testing.T) {
	for _, typ := range []string{protocol.TypeOpenAICompat, protocol.TypeOllama} {
		t.Run("C2 "+typ, func(t *testing.T) {
			leakcheck.Check(t)
			fc := &fakeCredentials{}
			r := newCredRig(t, typ, fc)
			if typ == protocol.TypeOllama {
				r.st.run(evStart(), evComplete(2, "hi", "stop", nil, nil))
			} else {
				r.st.frames(fStart(200, "Content-Type", "application/json"), fBody([]byte(`{}`)), fEnd())
			}
			resp, body := r.do(t, "POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer k-a")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var l *iop.CredentialLease
			var b *iop.CredentialLeaseBinding
			if typ == protocol.TypeOllama {
				l, b = r.d.lastRun().GetCredentialLease(), r.d.lastRun().GetCredentialBinding()
			} else {
				l, b = r.d.lastTunnel().GetCredentialLease(), r.d.lastTunnel().GetCredentialBinding()
			}
			if l.GetLeaseId() != "lease-prov" || b.GetNodeId() != "n1" {
				t.Fatalf("request carries %v %v, want the issued pair", l, b)
			}
			want := creds.Request{Principal: "team-a", Model: "tiny", Node: "n1", Provider: "prov", Target: "tiny:latest"}
			if len(fc.reqs) != 1 || fc.reqs[0] != want {
				t.Fatalf("lease requests %+v, want [%+v]", fc.reqs, want)
			}
			checkOneOutcome(t, r, 0)
		})
	}
}

// C2, C4: when no lease can be issued the request ends with a 502 naming
// the credential, nothing is dispatched (so nothing reaches the upstream),
// and the provider lease goes back once.
func TestCredentialNotIssued(t *testing.T) {
	leakcheck.Check(t)
	r := newCredRig(t, protocol.TypeOpenAICompat, &fakeCredentials{err: errors.New("sealing failed")})
	resp, body := r.do(t, "POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer k-a")
	e := checkShape(t, body, false)
	if resp.StatusCode != 502 || e.Error.Code == nil || *e.Error.Code != "credential_unavailable" {
		t.Fatalf("got %d %s, want 502 credential_unavailable", resp.StatusCode, body)
	}
	if strings.Contains(body, "sealing failed") {
		t.Fatal("the edge's internal error reached the client")
	}
	if r.d.lastTunnel() != nil {
		t.Fatal("C4: a request without its lease was dispatched")
	}
	r.srv.Close() // waits for the handler, which released the lease before it returned
	if n := r.fp.releases.Load(); n != 1 {
		t.Fatalf("Q2: %d releases, want 1", n)
	}
}

// C4: a node that refuses the lease ends the request with a 502
// credential_rejected naming why, in each surface's shape.
func TestCredentialRejectedByNode(t *testing.T) {
	rows := []struct {
		name, code, path string
		anthropic        bool
	}{
		{"C4 expired lease", protocol.CodeCredentialInvalid.String(), "/v1/chat/completions", false},
		{"C4 lease required", protocol.CodeCredentialRequired.String(), "/v1/messages", true},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			fc := &fakeCredentials{}
			r := newCredRig(t, protocol.TypeOpenAICompat, fc)
			r.st.frames(fError(row.code, `credential lease rejected: credential lease expired: expired 9000 ms ago`))
			resp, body := r.do(t, "POST", row.path, chatBody, "Authorization", "Bearer k-a")
			if resp.StatusCode != 502 || !strings.Contains(body, "refused the request's credential lease: credential lease rejected: credential lease expired") {
				t.Fatalf("got %d %s", resp.StatusCode, body)
			}
			e := checkShape(t, body, row.anthropic)
			if !row.anthropic && (e.Error.Code == nil || *e.Error.Code != "credential_rejected") {
				t.Fatalf("code %v, want credential_rejected", e.Error.Code)
			}
			checkOneOutcome(t, r, 0)
			if n := len(fc.reqs); n != 1 {
				t.Fatalf("C6: %d leases issued, want 1: a refused route never retries with another credential", n)
			}
		})
	}
}
