package adapter_test

import (
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/leakcheck"
	"iop/internal/lease"
	"iop/internal/node/adapter"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// leaseKit is an Edge's issuer and one Node's recipient key, as `edge pki`
// makes them, and the Node's Opener.
type leaseKit struct {
	issuer    *lease.Issuer
	recipient *lease.Recipient
	opener    *lease.Opener
	now       time.Time
}

const kitSecret = "sk-lease-SECRET-42"

func newLeaseKit(t testing.TB) *leaseKit {
	t.Helper()
	_, ipriv, _ := ed25519.GenerateKey(rand.Reader)
	rpriv, _ := ecdh.X25519().GenerateKey(rand.Reader)
	is, err := lease.NewIssuer(ipriv, 0)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := lease.NewRecipient(rpriv.PublicKey())
	o, err := lease.NewOpener(rpriv, []ed25519.PublicKey{ipriv.Public().(ed25519.PublicKey)}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return &leaseKit{issuer: is, recipient: r, opener: o, now: time.UnixMilli(1_760_000_000_000)}
}

// binding is a lease binding for adapter "llama" (profile llamacpp) on
// node gpu-1, target tiny, slot "llama" at revision 2, generation 10.
func kitBinding() *iop.CredentialLeaseBinding {
	return &iop.CredentialLeaseBinding{Principal: "team-a", Slot: "llama", Route: "tiny-oa", Profile: "llamacpp",
		UpstreamTarget: "tiny", NodeId: "gpu-1", Provider: "llama", CredentialRevision: 2, ProjectionGeneration: 10,
		AuthHeader: "Authorization", AuthScheme: "Bearer"}
}

func (k *leaseKit) issue(t testing.TB, b *iop.CredentialLeaseBinding) *iop.CredentialLease {
	t.Helper()
	l, err := k.issuer.Issue(k.now, k.recipient, b, []byte(kitSecret))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// planeSet is a Set with the credential plane on, as the Edge's payload
// turns it on: generation 10, slot "llama" at revision 2.
func (k *leaseKit) planeSet(t testing.TB, adapters ...*iop.AdapterConfig) *adapter.Set {
	t.Helper()
	s, err := adapter.NewSet(&iop.NodeConfigPayload{Adapters: adapters, Runtime: &iop.NodeRuntimeConfig{
		CredentialsEnabled: true, CredentialProjectionGeneration: 10, CredentialSlotRevisions: map[string]uint64{"llama": 2}}},
		adapter.Options{NodeID: "gpu-1", Leases: k.opener, Now: func() time.Time { return k.now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// C3, C4, C6: with the plane on, a tunnel or run carries a lease that the
// node opens after the capacity gate and injects as the profile's auth
// header; every other lease ends the request with a credential_* ERROR and
// no upstream call.
func TestCredentialLease(t *testing.T) {
	leakcheck.Check(t)
	k := newLeaseKit(t)
	up := newFake(t, replay(200, "application/json", []byte(`{"object":"list","data":[]}`)))
	s := k.planeSet(t, compatAdapter("llama", llamaProfile(up.URL), 4))
	tunnel := func(l *iop.CredentialLease, b *iop.CredentialLeaseBinding) *iop.ProviderTunnelFrame {
		last, _, _, _ := checkTunnel(t, tunnelAll(context.Background(), s, &iop.ProviderTunnelRequest{Adapter: "llama", Target: "tiny",
			Operation: protocol.OpModels, CredentialLease: l, CredentialBinding: b}))
		return last
	}
	// C3: a valid lease: the upstream gets the secret in the profile's header.
	b := kitBinding()
	l := k.issue(t, b)
	if last := tunnel(l, b); last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_END {
		t.Fatalf("C3 valid lease: got %v %q", last.GetKind(), last.GetError())
	}
	reqs := up.requests()
	if len(reqs) != 1 || reqs[0].Header.Get("Authorization") != "Bearer "+kitSecret {
		t.Fatalf("C3: upstream saw %d requests, Authorization %q", len(reqs), reqs[0].Header.Get("Authorization"))
	}
	rows := []struct {
		name string
		l    func() (*iop.CredentialLease, *iop.CredentialLeaseBinding)
		code string
	}{
		{"C3 replayed lease", func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) { return l, b }, protocol.CodeCredentialInvalid.String()},
		{"C4 no lease with the plane on", func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) { return nil, nil }, protocol.CodeCredentialRequired.String()},
		{"C4 lease without binding", func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) { return k.issue(t, kitBinding()), nil }, protocol.CodeCredentialInvalid.String()},
		{"C4 binding without lease", func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) { return nil, kitBinding() }, protocol.CodeCredentialInvalid.String()},
		{"C6 lease for another node", bound(k, t, func(b *iop.CredentialLeaseBinding) { b.NodeId = "gpu-2" }), protocol.CodeCredentialInvalid.String()},
		{"C6 lease for another target", bound(k, t, func(b *iop.CredentialLeaseBinding) { b.UpstreamTarget = "big" }), protocol.CodeCredentialInvalid.String()},
		{"C6 lease for another adapter", bound(k, t, func(b *iop.CredentialLeaseBinding) { b.Provider = "other" }), protocol.CodeCredentialInvalid.String()},
		{"C6 lease for another profile", bound(k, t, func(b *iop.CredentialLeaseBinding) { b.Profile = "vllm" }), protocol.CodeCredentialInvalid.String()},
		{"C6 lease of an older revision", bound(k, t, func(b *iop.CredentialLeaseBinding) { b.CredentialRevision = 1 }), protocol.CodeCredentialInvalid.String()},
		{"C6 lease of an older generation", bound(k, t, func(b *iop.CredentialLeaseBinding) { b.ProjectionGeneration = 9 }), protocol.CodeCredentialInvalid.String()},
		{"C3 tampered ciphertext", func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) {
			b := kitBinding()
			l := k.issue(t, b)
			l.Ciphertext[0] ^= 1
			return l, b
		}, protocol.CodeCredentialInvalid.String()},
		{"C3 a credential that is no HTTP header value", func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) {
			b := kitBinding()
			l, err := k.issuer.Issue(k.now, k.recipient, b, []byte(kitSecret+"\x01"))
			if err != nil {
				t.Fatal(err)
			}
			return l, b
		}, protocol.CodeCredentialInvalid.String()},
		{"C3 expired lease", func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) {
			b := kitBinding()
			old := *k
			old.now = k.now.Add(-lease.DefaultTTL - lease.DefaultSkew - time.Second)
			return old.issue(t, b), b
		}, protocol.CodeCredentialInvalid.String()},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			last := tunnel(row.l())
			if last.GetKind() != iop.TunnelFrameKind_TUNNEL_FRAME_ERROR || last.GetFailureCode() != row.code {
				t.Fatalf("got %v %q (%q), want ERROR %q", last.GetKind(), last.GetFailureCode(), last.GetError(), row.code)
			}
			if strings.Contains(last.GetError(), kitSecret) {
				t.Fatal("C5: the error names the secret")
			}
			if n := len(up.requests()); n != 1 {
				t.Fatalf("C4: %d upstream calls, want still 1: nothing reaches the upstream", n)
			}
		})
	}
}

// bound returns a row builder: a lease signed for kitBinding changed by f.
func bound(k *leaseKit, t *testing.T, f func(*iop.CredentialLeaseBinding)) func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) {
	return func() (*iop.CredentialLease, *iop.CredentialLeaseBinding) {
		b := kitBinding()
		f(b)
		return k.issue(t, b), b
	}
}

// C3: the lease is opened only after the capacity gate: a request refused
// over capacity leaves its lease unopened, so it still opens afterwards.
// The run path injects the credential as the tunnel does, on ollama's
// Authorization: Bearer.
func TestCredentialOpenedAfterAdmission(t *testing.T) {
	leakcheck.Check(t)
	k := newLeaseKit(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	up := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), "hold") {
			entered <- struct{}{}
			<-release
		}
		replay(200, "application/x-ndjson", sample(t, "ollama_api_chat_stream.ndjson"))(w, r, body)
	})
	s := k.planeSet(t, ollamaAdapter("ollama", up.URL, 1))
	ob := func() *iop.CredentialLeaseBinding {
		b := kitBinding()
		b.Provider, b.Profile, b.Slot = "ollama", "ollama", "ollama"
		return b
	}
	run := func(text string, l *iop.CredentialLease, b *iop.CredentialLeaseBinding) *iop.RunEvent {
		last, _ := checkRun(t, runAll(context.Background(), s, &iop.RunRequest{Adapter: "ollama", Target: "tiny",
			Input: userInput(text), CredentialLease: l, CredentialBinding: b}))
		return last
	}
	b1 := ob()
	l1 := k.issue(t, b1)
	done := make(chan *iop.RunEvent, 1)
	go func() { done <- run("hold", l1, b1) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first run never reached the upstream")
	}
	b2 := ob()
	l2 := k.issue(t, b2)
	if last := run("second", l2, b2); last.GetFailureCode() != protocol.CodeOverCapacity.String() {
		t.Fatalf("E4: got %q (%q), want over_capacity", last.GetFailureCode(), last.GetError())
	}
	close(release)
	if last := <-done; last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
		t.Fatalf("first run: %v %q", last.GetType(), last.GetError())
	}
	if last := run("third", l2, b2); last.GetType() != iop.RunEventType_RUN_EVENT_COMPLETE {
		t.Fatalf("C3: the lease refused over capacity was consumed: %v %q", last.GetType(), last.GetError())
	}
	for i, r := range up.requests() {
		if got := r.Header.Get("Authorization"); got != "Bearer "+kitSecret {
			t.Fatalf("C3: run %d reached the upstream with Authorization %q", i, got)
		}
	}
}

// C3: a Set with the plane on needs the node's lease keys, and they must
// be the ones the payload says the edge seals to and signs with: a node
// whose keys are not refuses the payload, naming both key ids, instead of
// becoming ready and refusing every lease.
func TestCredentialPlaneNeedsKeys(t *testing.T) {
	_, err := adapter.NewSet(&iop.NodeConfigPayload{Runtime: &iop.NodeRuntimeConfig{CredentialsEnabled: true}}, adapter.Options{})
	if err == nil || !strings.Contains(err.Error(), "recipient_private_key_file") {
		t.Fatalf("got %v, want ErrNoLeaseKeys", err)
	}
	k := newLeaseKit(t)
	rid, iid := k.opener.RecipientKeyID(), k.opener.IssuerKeyIDs()[0]
	for _, row := range []struct {
		name       string
		recipient  string
		issuer     string
		want       error
		wantInText string
	}{
		{"C3 the payload names this node's keys", rid, iid, nil, ""},
		{"C3 an edge that names no key ids is not checked", "", "", nil, ""},
		{"C3 sealed to another recipient key", "0123456789abcdef", iid, adapter.ErrLeaseKeyMismatch, "recipient key 0123456789abcdef, this node's credentials.recipient_private_key_file is key " + rid},
		{"C3 signed by another issuer key", rid, "fedcba9876543210", adapter.ErrLeaseKeyMismatch, "issuer key fedcba9876543210, this node's credentials.issuer_public_key(s) are keys " + iid},
	} {
		t.Run(row.name, func(t *testing.T) {
			s, err := adapter.NewSet(&iop.NodeConfigPayload{Runtime: &iop.NodeRuntimeConfig{CredentialsEnabled: true,
				CredentialRecipientKeyId: row.recipient, CredentialIssuerKeyId: row.issuer}},
				adapter.Options{NodeID: "gpu-1", Leases: k.opener})
			if err == nil {
				s.Close()
			}
			if !errors.Is(err, row.want) || (row.want != nil && !strings.Contains(err.Error(), row.wantInText)) {
				t.Fatalf("got %v, want %v naming %q", err, row.want, row.wantInText)
			}
		})
	}
}
