package keystore

import "fmt"

// The priority classes a key may have, highest first (SPEC G2).
const (
	ClassCritical    = "critical"
	ClassInteractive = "interactive"
	ClassBatch       = "batch"
)

// MaxWeight bounds a key's weight (SPEC G1).
const MaxWeight = 1000

// ClassRank is a class's rank, higher served first: critical 2,
// interactive 1, batch 0; -1 for anything else.
func ClassRank(class string) int {
	switch class {
	case ClassCritical:
		return 2
	case ClassInteractive:
		return 1
	case ClassBatch:
		return 0
	}
	return -1
}

// Sched is a key's place in the queue (SPEC G1, G4): its fair-share
// weight (1–MaxWeight; 0 = 1), the class its requests get by default
// ("" = interactive) and the highest class a request of it may ask for
// ("" = its Class).
type Sched struct {
	Weight   int
	Class    string
	MaxClass string
}

// Effective is s with its defaults filled in.
func (s Sched) Effective() Sched {
	if s.Weight == 0 {
		s.Weight = 1
	}
	if s.Class == "" {
		s.Class = ClassInteractive
	}
	if s.MaxClass == "" {
		s.MaxClass = s.Class
	}
	return s
}

// Check returns an error naming the first bad field by the name given for
// it in names (weight, class, max class): a weight outside 0–MaxWeight, an
// unknown class, or a class above the max class.
func (s Sched) Check(names [3]string) error {
	e := s.Effective()
	switch {
	case s.Weight < 0 || s.Weight > MaxWeight:
		return fmt.Errorf("%s: must be between 1 and %d, got %d", names[0], MaxWeight, s.Weight)
	case ClassRank(e.Class) < 0:
		return fmt.Errorf("%s: must be critical, interactive or batch, got %q", names[1], s.Class)
	case ClassRank(e.MaxClass) < 0:
		return fmt.Errorf("%s: must be critical, interactive or batch, got %q", names[2], s.MaxClass)
	case ClassRank(e.Class) > ClassRank(e.MaxClass):
		return fmt.Errorf("%s: %q is above the key's max class %q", names[1], e.Class, e.MaxClass)
	}
	return nil
}

// jsonSchedNames are the file's names of Sched's fields.
var jsonSchedNames = [3]string{"weight", "class", "max_class"}

// Sched returns k's place in the queue as stored (not defaulted).
func (k *Key) Sched() Sched { return Sched{Weight: k.Weight, Class: k.Class, MaxClass: k.MaxClass} }

// SetSched replaces key name's place in the queue (`edge keys rotate
// -weight -class -max-class`). Errors: ErrNoKey, ErrRevoked, a bad Sched.
func (s *Store) SetSched(name string, sc Sched) error {
	k := s.keys[name]
	switch {
	case k == nil:
		return fmt.Errorf("%w %q", ErrNoKey, name)
	case !k.RevokedAt.IsZero():
		return fmt.Errorf("%q: %w", name, ErrRevoked)
	}
	if err := sc.Check(jsonSchedNames); err != nil {
		return err
	}
	c := *k
	c.Weight, c.Class, c.MaxClass = sc.Weight, sc.Class, sc.MaxClass
	s.keys[name] = &c
	return nil
}
