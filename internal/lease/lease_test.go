package lease

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"iop/internal/leakcheck"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// keys is one Edge's issuer pair and two Nodes' recipient pairs.
type keys struct {
	issuer      ed25519.PrivateKey
	otherIssuer ed25519.PrivateKey
	node        *ecdh.PrivateKey
	otherNode   *ecdh.PrivateKey
}

func newKeys(t testing.TB) keys {
	t.Helper()
	gen := func() *ecdh.PrivateKey {
		k, err := ecdh.X25519().GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	_, iss, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	return keys{issuer: iss, otherIssuer: other, node: gen(), otherNode: gen()}
}

var (
	t0     = time.UnixMilli(1_760_000_000_000)
	secret = []byte("sk-test-0123456789abcdef")
)

func baseBinding() *iop.CredentialLeaseBinding {
	return &iop.CredentialLeaseBinding{
		Principal: "team-a", Slot: "openai-prod", Route: "gpt", Profile: "openai", UpstreamTarget: "gpt-4o-mini",
		NodeId: "gpu-1", Provider: "openai", CredentialRevision: 3, RouteRevision: 7, ProjectionGeneration: 100,
		AuthHeader: "Authorization", AuthScheme: "Bearer",
	}
}

func baseScope() Scope {
	return Scope{Node: "gpu-1", Provider: "openai", Target: "gpt-4o-mini", Profile: "openai",
		AuthHeader: "authorization", AuthScheme: "Bearer", Generation: 100, Revisions: map[string]uint64{"openai-prod": 3}}
}

// issue seals secret to recipient with b, signed by k.issuer at t0.
func issue(t testing.TB, k keys, signer ed25519.PrivateKey, recipient *ecdh.PrivateKey, b *iop.CredentialLeaseBinding) *iop.CredentialLease {
	t.Helper()
	is, err := NewIssuer(signer, 0)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRecipient(recipient.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	l, err := is.Issue(t0, r, b, secret)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// resign signs l and b again with signer, as an Edge that built them so
// would; only the issuer key can do that.
func resign(l *iop.CredentialLease, b *iop.CredentialLeaseBinding, signer ed25519.PrivateKey) {
	l.Signature = ed25519.Sign(signer, signedBytes(CanonicalBinding(b), l))
}

// TestOpenMatrix is the attack matrix of the credential plane: every way a
// lease can be wrong, each row naming the SPEC ID it proves. A row builds
// a lease for baseBinding sealed to the node's key at t0, lets mutate
// change the lease, binding, scope or clock, and opens it once (twice for
// replay rows).
func TestOpenMatrix(t *testing.T) {
	k := newKeys(t)
	type env struct {
		l     *iop.CredentialLease
		b     *iop.CredentialLeaseBinding
		scope Scope
		now   time.Time
		k     keys
	}
	rows := []struct {
		name   string
		mutate func(e *env)
		twice  bool // open the same lease a second time; the second result counts
		want   error
	}{
		{name: "C3 valid lease opens", mutate: func(*env) {}},
		{name: "C3 replayed lease", twice: true, want: ErrReplayed},
		{name: "C3 wrong recipient: sealed to another node's key", want: ErrRecipient, mutate: func(e *env) {
			b := baseBinding()
			e.l, e.b = issue(t, e.k, e.k.issuer, e.k.otherNode, b), b
		}},
		{name: "C3 wrong recipient: binding names another key, re-signed", want: ErrRecipient, mutate: func(e *env) {
			e.b.Recipient = KeyID(e.k.otherNode.PublicKey().Bytes())
			resign(e.l, e.b, e.k.issuer)
		}},
		{name: "C6 wrong node", want: ErrScope, mutate: func(e *env) { e.scope.Node = "gpu-2" }},
		{name: "C6 wrong target", want: ErrScope, mutate: func(e *env) { e.scope.Target = "gpt-4o" }},
		{name: "C6 wrong profile", want: ErrScope, mutate: func(e *env) { e.scope.Profile = "vllm" }},
		{name: "C6 wrong provider on the same node", want: ErrScope, mutate: func(e *env) { e.scope.Provider = "openai-2" }},
		{name: "C6 wrong auth header", want: ErrScope, mutate: func(e *env) { e.scope.AuthHeader = "x-api-key" }},
		{name: "C6 wrong auth scheme", want: ErrScope, mutate: func(e *env) { e.scope.AuthScheme = "" }},
		{name: "C6 older credential revision after rotation", want: ErrScope, mutate: func(e *env) { e.scope.Revisions["openai-prod"] = 4 }},
		{name: "C6 newer revision than the node applied yet", mutate: func(e *env) { e.scope.Revisions["openai-prod"] = 2 }},
		{name: "C6 slot the node does not know yet", mutate: func(e *env) { delete(e.scope.Revisions, "openai-prod") }},
		{name: "C6 older projection generation", want: ErrScope, mutate: func(e *env) { e.scope.Generation = 101 }},
		{name: "C6 newer projection generation than the node applied yet", mutate: func(e *env) { e.scope.Generation = 99 }},
		{name: "C3 expired beyond the skew", want: ErrExpired, mutate: func(e *env) { e.now = t0.Add(DefaultTTL + DefaultSkew + time.Millisecond) }},
		{name: "C3 expired within the skew", mutate: func(e *env) { e.now = t0.Add(DefaultTTL + DefaultSkew) }},
		{name: "C3 issued in the future beyond the skew", want: ErrNotYetValid, mutate: func(e *env) { e.now = t0.Add(-DefaultSkew - time.Millisecond) }},
		{name: "C3 issued in the future within the skew", mutate: func(e *env) { e.now = t0.Add(-DefaultSkew) }},
		{name: "C3 lifetime above the maximum, signed", want: ErrLifetime, mutate: func(e *env) {
			e.l.ExpiresAtUnixMs = e.l.IssuedAtUnixMs + MaxTTL.Milliseconds() + 1
			resign(e.l, e.b, e.k.issuer)
		}},
		{name: "C3 expiry before issue, signed", want: ErrLifetime, mutate: func(e *env) {
			e.l.ExpiresAtUnixMs = e.l.IssuedAtUnixMs
			resign(e.l, e.b, e.k.issuer)
		}},
		{name: "C3 tampered ciphertext", want: ErrSignature, mutate: func(e *env) { e.l.Ciphertext[0] ^= 1 }},
		{name: "C3 tampered ciphertext, signed: the AEAD catches it", want: ErrOpen, mutate: func(e *env) {
			e.l.Ciphertext[len(e.l.Ciphertext)-1] ^= 1
			resign(e.l, e.b, e.k.issuer)
		}},
		{name: "C3 tampered encapsulated key", want: ErrSignature, mutate: func(e *env) { e.l.HpkeEnc[0] ^= 1 }},
		{name: "C3 tampered binding", want: ErrSignature, mutate: func(e *env) { e.b.Principal = "team-b" }},
		{name: "C2 binding swapped after sealing, signed: the seal binds the binding", want: ErrOpen, mutate: func(e *env) {
			e.b.Route = "other-route"
			resign(e.l, e.b, e.k.issuer)
		}},
		{name: "C2 lease id swapped after sealing, signed: the seal binds the lease", want: ErrOpen, mutate: func(e *env) {
			e.l.LeaseId = "another-id"
			resign(e.l, e.b, e.k.issuer)
		}},
		{name: "C3 tampered signature", want: ErrSignature, mutate: func(e *env) { e.l.Signature[5] ^= 0x80 }},
		{name: "C3 signed by another key under our key id", want: ErrSignature, mutate: func(e *env) { resign(e.l, e.b, e.k.otherIssuer) }},
		{name: "C3 unknown issuer key", want: ErrIssuer, mutate: func(e *env) {
			b := baseBinding()
			e.l, e.b = issue(t, e.k, e.k.otherIssuer, e.k.node, b), b
		}},
		{name: "C3 empty lease id", want: ErrMalformed, mutate: func(e *env) { e.l.LeaseId = "" }},
		{name: "C3 signature cut short", want: ErrMalformed, mutate: func(e *env) { e.l.Signature = e.l.Signature[:10] }},
		{name: "C3 no ciphertext", want: ErrMalformed, mutate: func(e *env) { e.l.Ciphertext = nil }},
		{name: "C4 lease without binding", want: ErrMalformed, mutate: func(e *env) { e.b = nil }},
		{name: "C6 empty slot, signed", want: ErrScope, mutate: func(e *env) {
			e.b.Slot = ""
			resign(e.l, e.b, e.k.issuer)
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			b := baseBinding()
			e := &env{l: issue(t, k, k.issuer, k.node, b), b: b, scope: baseScope(), now: t0, k: k}
			if row.mutate != nil {
				row.mutate(e)
			}
			o, err := NewOpener(k.node, []ed25519.PublicKey{k.issuer.Public().(ed25519.PublicKey)}, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			pt, err := o.Open(e.now, e.scope, e.l, e.b)
			if row.twice {
				if err != nil {
					t.Fatalf("first open: %v", err)
				}
				pt, err = o.Open(e.now, e.scope, e.l, e.b)
			}
			if row.want == nil {
				if err != nil {
					t.Fatalf("got %v, want the lease to open", err)
				}
				if !bytes.Equal(pt, secret) {
					t.Fatalf("got plaintext of %d bytes, want the secret", len(pt))
				}
				return
			}
			if !errors.Is(err, row.want) {
				t.Fatalf("got %v, want %v", err, row.want)
			}
			var le *Error
			if !errors.As(err, &le) {
				t.Fatalf("got %T, want *lease.Error", err)
			}
			if pt != nil {
				t.Fatal("a rejected lease returned plaintext")
			}
			if bytes.Contains([]byte(err.Error()), secret) {
				t.Fatal("error message contains the secret")
			}
		})
	}
}

// C4: the presence rules, before any verification.
func TestCheckPresence(t *testing.T) {
	l, b := &iop.CredentialLease{LeaseId: "x"}, &iop.CredentialLeaseBinding{Slot: "s"}
	rows := []struct {
		name    string
		planeOn bool
		l       *iop.CredentialLease
		b       *iop.CredentialLeaseBinding
		want    error
	}{
		{"C4 plane on, both present: verify next", true, l, b, nil},
		{"C4 plane on, both absent", true, nil, nil, ErrMissing},
		{"C4 plane on, lease without binding", true, l, nil, ErrHalfPresent},
		{"C4 plane on, binding without lease", true, nil, b, ErrHalfPresent},
		{"C4 plane off, both absent: served", false, nil, nil, nil},
		{"C4 plane off with a lease present", false, l, b, ErrPlaneOff},
		{"C4 plane off, binding without lease", false, nil, b, ErrHalfPresent},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			err := CheckPresence(row.planeOn, row.l, row.b)
			if !errors.Is(err, row.want) || (row.want == nil) != (err == nil) {
				t.Fatalf("got %v, want %v", err, row.want)
			}
			if Required(err) != errors.Is(row.want, ErrMissing) {
				t.Fatalf("Required(%v) = %v", err, Required(err))
			}
		})
	}
}

// C2: the canonical binding bytes change with every field, so the seal and
// the signature cover each of them.
// C3, C5: a secret is usable as an upstream credential only when it goes
// into an HTTP header value unchanged; the error never quotes it.
func TestCheckHeaderValue(t *testing.T) {
	for _, row := range []struct {
		name   string
		secret string
		ok     bool
	}{
		{"C3 an API key", "sk-proj-AbC_123.xyz~", true},
		{"C3 obs-text bytes pass as HTTP carries them", "sk-\xff\xfe", true},
		{"C3 an inner space passes", "key with space", true},
		{"C3 LF would split the header", "sk-a\nX-Evil: 1", false},
		{"C3 CR", "sk-a\r", false},
		{"C3 NUL", "sk-\x00", false},
		{"C3 TAB", "sk-\tb", false},
		{"C3 another control character", "sk-\x01b", false},
		{"C3 DEL", "sk-\x7fb", false},
		{"C3 a leading space HTTP would strip", " sk-a", false},
		{"C3 a trailing space HTTP would strip", "sk-a ", false},
	} {
		t.Run(row.name, func(t *testing.T) {
			err := CheckHeaderValue([]byte(row.secret))
			if (err == nil) != row.ok || (err != nil && !errors.Is(err, ErrNotHeaderValue)) {
				t.Fatalf("got %v, want ok=%v", err, row.ok)
			}
			if err != nil && strings.Contains(err.Error(), "sk-") {
				t.Fatalf("C5: the error quotes the secret: %v", err)
			}
		})
	}
}

func TestCanonicalBindingCoversEveryField(t *testing.T) {
	base := CanonicalBinding(baseBinding())
	fields := baseBinding().ProtoReflect().Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		t.Run(string(fd.Name()), func(t *testing.T) {
			b := baseBinding()
			m := b.ProtoReflect()
			switch v := m.Get(fd).Interface().(type) {
			case string:
				m.Set(fd, protoreflect.ValueOf(v+"x"))
			case uint64:
				m.Set(fd, protoreflect.ValueOf(v+1))
			default:
				t.Fatalf("field %s of type %T: extend CanonicalBinding and this test", fd.Name(), v)
			}
			if bytes.Equal(CanonicalBinding(b), base) {
				t.Fatalf("changing %s leaves the canonical bytes unchanged", fd.Name())
			}
		})
	}
	// Length prefixes: moving bytes between adjacent strings changes them.
	a, b := baseBinding(), baseBinding()
	a.Principal, a.Slot = "ab", "c"
	b.Principal, b.Slot = "a", "bc"
	if bytes.Equal(CanonicalBinding(a), CanonicalBinding(b)) {
		t.Fatal("field boundaries are ambiguous")
	}
	if !proto.Equal(baseBinding(), baseBinding()) || !bytes.Equal(CanonicalBinding(baseBinding()), base) {
		t.Fatal("canonical bytes are not deterministic")
	}
}

// C3: the replay cache forgets ids only after their time, and refuses new
// ones when full of unexpired ids.
func TestReplayCache(t *testing.T) {
	c := NewReplayCache(2)
	steps := []struct {
		id         string
		until, now int64
		want       error
	}{
		{"a", 100, 0, nil},
		{"a", 100, 50, ErrReplayed},
		{"a", 100, 100, ErrReplayed}, // until is inclusive
		{"b", 200, 100, nil},
		{"c", 300, 100, ErrReplayFull},
		{"c", 300, 101, nil}, // a is forgotten after 100
		{"a", 400, 150, ErrReplayFull},
		{"a", 400, 201, nil}, // b is forgotten
		{"c", 300, 250, ErrReplayed},
	}
	for i, s := range steps {
		err := c.admit(s.id, s.until, s.now)
		if !errors.Is(err, s.want) || (s.want == nil) != (err == nil) {
			t.Fatalf("step %d admit(%s, now %d): got %v, want %v", i, s.id, s.now, err, s.want)
		}
		if s.want == nil && c.Len() > 2 {
			t.Fatalf("step %d: %d entries over capacity 2", i, c.Len())
		}
	}
	if c.Len() != 2 {
		t.Fatalf("got %d entries, want 2", c.Len())
	}
	// A longer-lived id in front does not keep a short-lived one from being
	// forgotten when the cache is full.
	c = NewReplayCache(2)
	_ = c.admit("long", 1000, 0)
	_ = c.admit("short", 10, 0)
	if err := c.admit("next", 1000, 11); err != nil {
		t.Fatalf("got %v, want the expired short id swept", err)
	}
}

// C2: the Issuer refuses what it must not seal.
func TestIssuerRejects(t *testing.T) {
	k := newKeys(t)
	if _, err := NewIssuer(k.issuer, MaxTTL+time.Second); err == nil {
		t.Fatal("TTL above MaxTTL accepted")
	}
	if _, err := NewIssuer(k.issuer[:10], 0); err == nil {
		t.Fatal("short issuer key accepted")
	}
	if _, err := NewRecipient(nil); err == nil {
		t.Fatal("nil recipient accepted")
	}
	is, _ := NewIssuer(k.issuer, 0)
	r, _ := NewRecipient(k.node.PublicKey())
	for _, s := range [][]byte{nil, make([]byte, MaxSecretBytes+1)} {
		if _, err := is.Issue(t0, r, baseBinding(), s); err == nil {
			t.Fatalf("secret of %d bytes sealed", len(s))
		}
	}
	l, err := is.Issue(t0, r, baseBinding(), secret)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.ExpiresAtUnixMs-l.IssuedAtUnixMs, DefaultTTL.Milliseconds(); got != want {
		t.Fatalf("lifetime %d ms, want %d", got, want)
	}
	if bytes.Contains(l.Ciphertext, secret) {
		t.Fatal("ciphertext contains the secret")
	}
	l2, _ := is.Issue(t0, r, baseBinding(), secret)
	if l.LeaseId == l2.LeaseId || bytes.Equal(l.HpkeEnc, l2.HpkeEnc) {
		t.Fatal("two leases share an id or an encapsulated key")
	}
}

// C2: leases sealed with prepared encapsulations open like any other, each
// with its own encapsulated key; the refill goroutine ends once the store
// is full.
func TestPrecompute(t *testing.T) {
	leakcheck.Check(t)
	k := newKeys(t)
	is, _ := NewIssuer(k.issuer, 0)
	r, _ := NewRecipient(k.node.PublicKey())
	r.Precompute(4)
	o, _ := NewOpener(k.node, []ed25519.PublicKey{k.issuer.Public().(ed25519.PublicKey)}, nil, 0)
	seen := map[string]bool{}
	for i := 0; i < 12; i++ { // more than the store holds: some made inline
		b := baseBinding()
		l, err := is.Issue(t0, r, b, secret)
		if err != nil {
			t.Fatal(err)
		}
		if seen[string(l.HpkeEnc)] {
			t.Fatalf("lease %d reuses an encapsulated key", i)
		}
		seen[string(l.HpkeEnc)] = true
		pt, err := o.Open(t0, baseScope(), l, b)
		if err != nil || !bytes.Equal(pt, secret) {
			t.Fatalf("lease %d: %v", i, err)
		}
	}
}

// C3 (issuer rotation with overlap): an Opener trusts every issuer key it
// was given — while the edge's issuer key is rotated a node trusts the old
// and the new one, so leases of both open — and no other.
func TestOpenerTrustsSeveralIssuers(t *testing.T) {
	k := newKeys(t)
	_, third, _ := ed25519.GenerateKey(rand.Reader)
	pub := func(p ed25519.PrivateKey) ed25519.PublicKey { return p.Public().(ed25519.PublicKey) }
	o, err := NewOpener(k.node, []ed25519.PublicKey{pub(k.issuer), pub(k.otherIssuer)}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := NewRecipient(k.node.PublicKey())
	for _, row := range []struct {
		name   string
		issuer ed25519.PrivateKey
		want   error
	}{
		{"C3 the old issuer key", k.issuer, nil},
		{"C3 the new issuer key", k.otherIssuer, nil},
		{"C3 a key the node does not trust", third, ErrIssuer},
	} {
		t.Run(row.name, func(t *testing.T) {
			is, _ := NewIssuer(row.issuer, 0)
			b := baseBinding()
			l, err := is.Issue(t0, r, b, secret)
			if err != nil {
				t.Fatal(err)
			}
			_, err = o.Open(t0, baseScope(), l, b)
			if !errors.Is(err, row.want) && !(row.want == nil && err == nil) {
				t.Fatalf("got %v, want %v", err, row.want)
			}
		})
	}
	if ids := o.IssuerKeyIDs(); len(ids) != 2 || !o.TrustsIssuer(KeyID(pub(k.issuer))) || o.TrustsIssuer(KeyID(pub(third))) {
		t.Errorf("IssuerKeyIDs %v", ids)
	}
	if _, err := NewOpener(k.node, nil, nil, 0); err == nil {
		t.Error("an Opener without an issuer key was made")
	}
}

// C3, C4 (a restart invalidates earlier leases): each Opener — one per
// node process — has its own boot id; a lease the edge bound to one boot
// (node_boot_id) opens there, once; after a restart (a new Opener with the
// same keys and an empty replay cache) that lease is refused with ErrBoot
// instead of opening a second time. A binding without a boot id (an edge
// that does not bind boots) is checked without it.
func TestBootBinding(t *testing.T) {
	k := newKeys(t)
	issuers := []ed25519.PublicKey{k.issuer.Public().(ed25519.PublicKey)}
	before, _ := NewOpener(k.node, issuers, nil, 0)
	after, _ := NewOpener(k.node, issuers, nil, 0) // the same node, restarted
	if before.BootID() == after.BootID() || len(before.BootID()) != 32 {
		t.Fatalf("boot ids %q and %q: want two different 32-hex-digit ids", before.BootID(), after.BootID())
	}
	is, _ := NewIssuer(k.issuer, 0)
	r, _ := NewRecipient(k.node.PublicKey())
	b := baseBinding()
	b.NodeBootId = before.BootID()
	l, err := is.Issue(t0, r, b, secret)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := before.Open(t0, baseScope(), l, b); err != nil {
		t.Fatalf("the boot the lease names: %v", err)
	}
	if _, err := before.Open(t0, baseScope(), l, b); !errors.Is(err, ErrReplayed) {
		t.Fatalf("replayed on the same boot: %v, want ErrReplayed", err)
	}
	if _, err := after.Open(t0, baseScope(), l, b); !errors.Is(err, ErrBoot) {
		t.Fatalf("C3: replayed after a restart: %v, want ErrBoot (the new replay cache is empty)", err)
	}
	legacy := baseBinding()
	ll, _ := is.Issue(t0, r, legacy, secret)
	if _, err := after.Open(t0, baseScope(), ll, legacy); err != nil {
		t.Fatalf("a binding without a boot id: %v", err)
	}
	// The boot id is signed: changing it breaks the signature.
	forged := proto.Clone(b).(*iop.CredentialLeaseBinding)
	forged.NodeBootId = after.BootID()
	if _, err := after.Open(t0, baseScope(), l, forged); !errors.Is(err, ErrSignature) {
		t.Fatalf("a binding with a rewritten boot id: %v, want ErrSignature", err)
	}
}
