package surface

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"

	"iop/internal/jsonscan"
)

// Disposition says what the run path does with one request field (issue
// 14: no request field is accepted and silently dropped).
type Disposition uint8

const (
	// Translated: sent to the backend in its native form (Ollama's
	// /api/chat: options, format, images, …) or enforced by the Edge.
	Translated Disposition = iota + 1
	// Refused: a 400 naming the field (for every value, or for the values
	// the row's note names; the others are translated).
	Refused
	// Routing: read by the Edge itself (model, stream).
	Routing
	// Advisory: accepted without effect because, by the API's own
	// definition, it does not change the answer (an end-user id for abuse
	// monitoring, a prompt-cache hint). The note says which definition.
	Advisory
)

func (d Disposition) String() string {
	switch d {
	case Translated:
		return "translated"
	case Refused:
		return "refused"
	case Routing:
		return "routing"
	case Advisory:
		return "advisory"
	}
	return "unknown"
}

// Field is one row of a surface's request field table: the field's JSON
// name (nested ones dotted, "messages[].content[].image_url"), what the run
// path does with it and how.
type Field struct {
	Name        string
	Disposition Disposition
	Note        string
	// Shape, when set, is the members the field's objects may carry
	// (CheckMembers refuses any other, at any depth).
	Shape *Shape
}

// JSONNames lists the JSON member names of struct type v (a struct value
// or pointer), in declaration order: the fields a parser knows. Tests use
// it to check that every parsed field has a table row.
func JSONNames(v any) []string {
	t := reflect.TypeOf(v)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var out []string
	for i := range t.NumField() {
		tag := t.Field(i).Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

// Decode decodes a JSON value nested in a request body (a content-block
// array, an item list) into v. Its members were checked by CheckMembers
// against the field table's Shapes before (DecodeRequest), so v's types
// decide only the value types: this is encoding/json's Unmarshal, not a
// strict json.Decoder, which would copy the value and allocate a decoder
// per call. Errors are 400s naming the field.
func Decode(raw []byte, v any) *Error {
	if err := json.Unmarshal(raw, v); err != nil {
		return JSONFieldError(err)
	}
	return nil
}

// Row is a Field: a table row written on one line.
func Row(name string, d Disposition, note string) Field {
	return Field{Name: name, Disposition: d, Note: note}
}

// Of returns f whose objects must have shape sh.
func (f Field) Of(sh *Shape) Field {
	f.Shape = sh
	return f
}

// CheckMembers returns a 400 naming the first member of the JSON object
// body that has no row in table, or, in the objects of a row with a
// Shape, no Member of it (as OpenAI's and Anthropic's APIs refuse unknown
// arguments): "foo", "messages[0].content[1].foo". Otherwise nil. body
// must already be valid JSON (the HTTP layer checks it before parsing
// anything); a body that is not an object yields nil, for the decoder to
// report. It allocates nothing unless a key is written with escapes or a
// member is unknown.
func CheckMembers(body []byte, table []Field) *Error {
	it, ok := jsonscan.NewMembers(body, jsonscan.All(body))
	if !ok {
		return nil
	}
	for {
		key, val, more := it.Next()
		if !more {
			return nil
		}
		f := knownKey(key, table)
		if f == nil {
			name := jsonscan.Key(key)
			return BadRequest(name, "unknown field %q: not a field of this API, or not one the model's provider supports", name)
		}
		if f.Shape != nil {
			if p, bad := f.Shape.check(body, val); bad {
				name := f.Name + p
				return BadRequest(name, "unknown field %q: not a field of this API, or not one the model's provider supports", name)
			}
		}
	}
}

func knownKey(raw []byte, table []Field) *Field {
	if bytes.IndexByte(raw, '\\') >= 0 {
		raw = []byte(jsonscan.Key(raw)) // a key written with escapes (rare)
	}
	for i := range table {
		if string(raw) == table[i].Name {
			return &table[i]
		}
	}
	return nil
}

// DecodeRequest decodes a request body into v: every top-level member must
// have a row in table (CheckMembers), nested objects are decoded as v's
// types say (encoding/json). Errors are 400s naming the field.
func DecodeRequest(body []byte, v any, table []Field) *Error {
	if e := CheckMembers(body, table); e != nil {
		return e
	}
	if err := json.Unmarshal(body, v); err != nil {
		return JSONFieldError(err)
	}
	return nil
}
