package routing

import (
	"errors"
	"fmt"
)

// Mode is a model group's routing mode (models[].routing).
type Mode uint8

// Routing modes. The zero value is LeastLoaded, the pool's behaviour
// before routing modes existed.
const (
	// LeastLoaded: the free live candidate with the lowest in_flight /
	// capacity, ties in config order.
	LeastLoaded Mode = iota
	// Ordered: the first free live candidate in config order (preference
	// order: later candidates take spill-over only).
	Ordered
	// PrefixAffinity: the candidate holding the longest prefix of the
	// conversation, else bounded-load rendezvous hashing (see package doc).
	PrefixAffinity
)

// Config names of the modes.
const (
	NameLeastLoaded    = "least_loaded"
	NameOrdered        = "ordered"
	NamePrefixAffinity = "prefix_affinity"
)

// ErrUnknownMode: a routing mode name other than the three above.
var ErrUnknownMode = errors.New("routing: unknown mode")

// ParseMode maps a config name to its Mode; "" is LeastLoaded. Other names
// fail with ErrUnknownMode.
func ParseMode(name string) (Mode, error) {
	switch name {
	case "", NameLeastLoaded:
		return LeastLoaded, nil
	case NameOrdered:
		return Ordered, nil
	case NamePrefixAffinity:
		return PrefixAffinity, nil
	}
	return LeastLoaded, fmt.Errorf("%w %q (want %s, %s or %s)", ErrUnknownMode, name, NameOrdered, NameLeastLoaded, NamePrefixAffinity)
}

func (m Mode) String() string {
	switch m {
	case Ordered:
		return NameOrdered
	case PrefixAffinity:
		return NamePrefixAffinity
	}
	return NameLeastLoaded
}

// Result says how Choose decided; it is the label of
// iop_edge_routing_decisions_total.
type Result uint8

// Results of a prefix_affinity decision.
const (
	// ResultPrefixHit: the chosen candidate holds the longest prefix of the
	// request that any live candidate holds.
	ResultPrefixHit Result = iota
	// ResultHash: no live candidate held a prefix of the request; the
	// bounded-load rendezvous hash chose.
	ResultHash
	// ResultFallback: the request carried no conversation to hash, or every
	// holder of its longest prefix was at capacity (or not live) and
	// another candidate took it.
	ResultFallback
	// ResultYield: a free holder of the request's longest prefix was
	// passed over for a candidate where the turn's first token is expected
	// sooner: the prefill queued on the holder outweighed the prefill it
	// would have saved (see Choose).
	ResultYield
	// NumResults is the number of Results (for counter arrays).
	NumResults
)

func (r Result) String() string {
	switch r {
	case ResultPrefixHit:
		return "prefix_hit"
	case ResultHash:
		return "hash"
	case ResultYield:
		return "yield"
	}
	return "fallback"
}
