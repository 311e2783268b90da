package surface

import (
	"bytes"
	"strconv"

	"iop/internal/jsonscan"
)

// Shape is the set of members an object nested in a request may carry and
// the shapes of the objects nested in those (F2: a member the run
// path does not know is a 400 naming it at any depth, as OpenAI's and
// Anthropic's APIs answer; never accepted and ignored). A Shape applies to
// an object value, and to every object in an array value (at any depth of
// arrays); strings, numbers and the rest are left to the parser.
type Shape struct {
	// Members every object of the shape may carry.
	Members []Member
	// Types: the further members allowed by the object's "type" value
	// (an absent "type" selects the Variant with Type ""). An object
	// whose type has no Variant is not checked further: the parser
	// refuses that type by name.
	Types []Variant
}

// Member is one allowed member of a Shape: its JSON name and the shape of
// its value's objects (nil: not checked, e.g. a JSON Schema or a
// function's arguments, which are the client's own).
type Member struct {
	Name  string
	Shape *Shape
}

// Variant is the members one "type" of a Shape's objects adds.
type Variant struct {
	Type    string
	Members []Member
}

// M is a Member written on one line.
func M(name string, sh *Shape) Member { return Member{Name: name, Shape: sh} }

// Names returns every member name m lists; tests compare them with the
// JSON names of the parser's structs.
func Names(m ...Member) []string {
	out := make([]string, len(m))
	for i := range m {
		out[i] = m[i].Name
	}
	return out
}

// AllNames returns the names of sh's Members and of every Variant's, each
// once: the members of the union struct a parser decodes such an object
// into.
func (sh *Shape) AllNames() []string {
	seen := map[string]bool{}
	var out []string
	add := func(ms []Member) {
		for _, m := range ms {
			if !seen[m.Name] {
				seen[m.Name] = true
				out = append(out, m.Name)
			}
		}
	}
	add(sh.Members)
	for _, v := range sh.Types {
		add(v.Members)
	}
	return out
}

// check reports, through sc, the members below v that sh does not allow,
// as paths relative to v (".foo", "[2].content[0].foo"); it stops at the
// first one unless sc.all. b must be valid JSON. It allocates only to
// build the paths of unknown members (at most MaxIgnored of them).
func (sh *Shape) check(b []byte, v jsonscan.Span, sc *scan) []string {
	switch jsonscan.Kind(b, v) {
	case '[':
		var out []string
		els := jsonscan.NewElements(b, v)
		for i := 0; ; i++ {
			el, more := els.Next()
			if !more {
				return out
			}
			for _, p := range sh.check(b, el, sc) {
				out = append(out, "["+strconv.Itoa(i)+"]"+p)
			}
			if sc.stop() {
				return out
			}
		}
	case '{':
		return sh.checkObject(b, v, sc)
	}
	return nil
}

func (sh *Shape) checkObject(b []byte, v jsonscan.Span, sc *scan) []string {
	var variant []Member
	if len(sh.Types) > 0 {
		var ok bool
		if variant, ok = sh.variant(typeOf(b, v)); !ok {
			return nil
		}
	}
	var out []string
	it, _ := jsonscan.NewMembers(b, v)
	for {
		key, val, more := it.Next()
		if !more {
			return out
		}
		m := find(key, sh.Members)
		if m == nil {
			m = find(key, variant)
		}
		if m == nil {
			if sc.add() {
				out = append(out, "."+jsonscan.Key(key))
			}
		} else if m.Shape != nil {
			for _, p := range m.Shape.check(b, val, sc) {
				out = append(out, "."+m.Name+p)
			}
		}
		if sc.stop() {
			return out
		}
	}
}

// scan counts the unknown members one check finds: all of them (report
// mode) or the first (reject mode); paths are kept for at most
// MaxIgnored.
type scan struct {
	all bool
	n   int // unknown members found
}

// add counts one unknown member and reports whether its path is kept.
func (sc *scan) add() bool {
	sc.n++
	return sc.n <= MaxIgnored
}

// stop reports whether the scan is done (reject mode after the first).
func (sc *scan) stop() bool { return !sc.all && sc.n > 0 }

// variant returns the members the object's type adds; ok is false for a
// type without a Variant.
func (sh *Shape) variant(typ []byte) ([]Member, bool) {
	for i := range sh.Types {
		if string(typ) == sh.Types[i].Type {
			return sh.Types[i].Members, true
		}
	}
	return nil, false
}

// typeOf returns the object's "type" string (escapes resolved), or nil
// when it has none or it is not a string.
func typeOf(b []byte, v jsonscan.Span) []byte {
	it, _ := jsonscan.NewMembers(b, v)
	for {
		key, val, more := it.Next()
		if !more {
			return nil
		}
		if jsonscan.KeyIs(key, "type") {
			if jsonscan.Kind(b, val) != '"' {
				return nil
			}
			raw := b[val.Start+1 : val.End-1]
			if bytes.IndexByte(raw, '\\') >= 0 {
				s, _ := StringValue(b[val.Start:val.End])
				return []byte(s)
			}
			return raw
		}
	}
}

func find(key []byte, ms []Member) *Member {
	if bytes.IndexByte(key, '\\') >= 0 {
		key = []byte(jsonscan.Key(key))
	}
	for i := range ms {
		if string(key) == ms[i].Name {
			return &ms[i]
		}
	}
	return nil
}
