package lease

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hpke"
	"testing"
	"time"

	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// BenchmarkSealSign is the Edge's cost per request with the credential
// plane on: one HPKE seal (an X25519 key generation and exchange, HKDF,
// AES-256-GCM) and one Ed25519 signature.
//
//	go test -run '^$' -bench 'SealSign|VerifyOpen' -benchmem ./internal/lease/
func BenchmarkSealSign(b *testing.B) {
	k := newKeys(b)
	is, _ := NewIssuer(k.issuer, 0)
	r, _ := NewRecipient(k.node.PublicKey())
	bind := baseBinding()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := is.Issue(t0, r, bind, secret); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSealSignPrepared is the Edge's cost on the request's path when
// the HPKE encapsulation was prepared ahead (Recipient.Precompute): the
// AES-GCM seal and the Ed25519 signature. The preparation (the X25519 work
// of BenchmarkSealSign) is done off the timer, as the refill goroutine does
// it off the request's path.
func BenchmarkSealSignPrepared(b *testing.B) {
	k := newKeys(b)
	is, _ := NewIssuer(k.issuer, 0)
	r, _ := NewRecipient(k.node.PublicKey())
	const n = 256
	r.ready = make(chan prepared, n)
	bind := baseBinding()
	kdf, aead := suite()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i%n == 0 {
			b.StopTimer()
			for len(r.ready) < n {
				enc, s, err := hpke.NewSender(r.pub, kdf, aead, []byte(hpkeInfo))
				if err != nil {
					b.Fatal(err)
				}
				r.ready <- prepared{enc: enc, sender: s}
			}
			r.filling.Store(true) // no refill goroutine: the timer must not see it
			b.StartTimer()
		}
		if _, err := is.Issue(t0, r, bind, secret); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkVerifyOpen is the Node's cost per request: signature check,
// scope, expiry, replay cache, HPKE open. Each iteration opens a distinct
// lease (a lease opens once).
func BenchmarkVerifyOpen(b *testing.B) {
	k := newKeys(b)
	is, _ := NewIssuer(k.issuer, 0)
	r, _ := NewRecipient(k.node.PublicKey())
	const n = 1024
	leases := make([]*iop.CredentialLease, n)
	for i := range leases {
		l, err := is.Issue(t0, r, baseBinding(), secret)
		if err != nil {
			b.Fatal(err)
		}
		leases[i] = l
	}
	bind := baseBinding()
	bind.Recipient = r.KeyID()
	scope := baseScope()
	b.ReportAllocs()
	i := 0
	var o *Opener
	for b.Loop() {
		if i%n == 0 {
			b.StopTimer()
			o, _ = NewOpener(k.node, []ed25519.PublicKey{k.issuer.Public().(ed25519.PublicKey)}, nil, 0)
			b.StartTimer()
		}
		pt, err := o.Open(t0.Add(time.Second), scope, leases[i%n], bind)
		if err != nil {
			b.Fatal(err)
		}
		clear(pt)
		i++
	}
}

// FuzzOpen feeds arbitrary lease and binding encodings to Open: it must
// reject them with an *Error, never panic, and never open anything not
// signed by the issuer.
func FuzzOpen(f *testing.F) {
	k := newKeys(f)
	is, _ := NewIssuer(k.issuer, 0)
	r, _ := NewRecipient(k.node.PublicKey())
	bind := baseBinding()
	l, _ := is.Issue(t0, r, bind, secret)
	lb, _ := proto.Marshal(l)
	bb, _ := proto.Marshal(bind)
	f.Add(lb, bb)
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, lraw, braw []byte) {
		var fl iop.CredentialLease
		var fb iop.CredentialLeaseBinding
		if proto.Unmarshal(lraw, &fl) != nil || proto.Unmarshal(braw, &fb) != nil {
			return
		}
		o, _ := NewOpener(k.node, []ed25519.PublicKey{k.issuer.Public().(ed25519.PublicKey)}, nil, 0)
		pt, err := o.Open(t0, baseScope(), &fl, &fb)
		if err == nil {
			if !bytes.Equal(signedBytes(CanonicalBinding(&fb), &fl), signedBytes(CanonicalBinding(bind), l)) {
				t.Fatalf("opened a lease the issuer did not sign")
			}
			clear(pt)
			return
		}
		if _, ok := err.(*Error); !ok {
			t.Fatalf("got %T, want *lease.Error", err)
		}
	})
}
