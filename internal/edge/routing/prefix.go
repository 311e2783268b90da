package routing

import "hash/maphash"

// Hasher hashes conversations into prefix chains. Hashes are only
// comparable between chains of the same Hasher (its seed is random per
// process, as maphash's are): the Edge makes one and keeps it. Safe for
// concurrent use; the zero value is not usable.
type Hasher struct{ seed maphash.Seed }

// NewHasher returns a Hasher with a fresh random seed.
func NewHasher() *Hasher { return &Hasher{seed: maphash.MakeSeed()} }

// Chain is one conversation's running hash: Start it with the model name,
// Seed it with the preamble (tools, system prompt), then Add one element
// per message. A Chain is a value with no allocation; it is not safe for
// concurrent use.
type Chain struct {
	seed maphash.Seed
	h    uint64
}

// Start begins a chain for a request to model (the client's model name, so
// that two groups sharing a provider never alias each other's prefixes).
func (hs *Hasher) Start(model string) Chain {
	return Chain{seed: hs.seed, h: maphash.String(hs.seed, model)}
}

// Add folds elem — the JSON bytes of one message, or of a preamble part —
// into the chain and returns the hash of everything added so far. The bytes
// are hashed as sent: two clients that serialize the same message
// differently get different hashes (a cache miss, never a wrong answer).
// Cost: one maphash pass over elem, no allocation.
func (c *Chain) Add(elem []byte) uint64 {
	c.h = mix(c.h*0x9e3779b97f4a7c15 ^ maphash.Bytes(c.seed, elem))
	return c.h
}

// Sum is the hash of everything added so far.
func (c *Chain) Sum() uint64 { return c.h }

// mix is the SplitMix64 finalizer (Steele, Lea, Flood 2014): a bijection
// that spreads every input bit over the output.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// ProviderID is the rendezvous identity of a provider, a stable function
// of its "node/provider" name (the same in every process and config).
func ProviderID(name string) uint64 {
	// FNV-1a 64 (the IETF draft's parameters), then mixed.
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return mix(h)
}
