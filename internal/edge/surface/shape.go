package surface

import (
	"bytes"
	"strconv"

	"iop/internal/jsonscan"
)

// Shape is the set of members an object nested in a request may carry and
// the shapes of the objects nested in those (issue 14: a member the run
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

// check returns the path below v of the first member sh does not allow
// (".foo", "[2].content[0].foo"), or bad=false. b must be valid JSON.
// It allocates only to build the path of an unknown member.
func (sh *Shape) check(b []byte, v jsonscan.Span) (path string, bad bool) {
	switch jsonscan.Kind(b, v) {
	case '[':
		els := jsonscan.NewElements(b, v)
		for i := 0; ; i++ {
			el, more := els.Next()
			if !more {
				return "", false
			}
			if p, bad := sh.check(b, el); bad {
				return "[" + strconv.Itoa(i) + "]" + p, true
			}
		}
	case '{':
		return sh.checkObject(b, v)
	}
	return "", false
}

func (sh *Shape) checkObject(b []byte, v jsonscan.Span) (string, bool) {
	var variant []Member
	if len(sh.Types) > 0 {
		var ok bool
		if variant, ok = sh.variant(typeOf(b, v)); !ok {
			return "", false
		}
	}
	it, _ := jsonscan.NewMembers(b, v)
	for {
		key, val, more := it.Next()
		if !more {
			return "", false
		}
		m := find(key, sh.Members)
		if m == nil {
			m = find(key, variant)
		}
		if m == nil {
			return "." + jsonscan.Key(key), true
		}
		if m.Shape != nil {
			if p, bad := m.Shape.check(b, val); bad {
				return "." + m.Name + p, true
			}
		}
	}
}

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
