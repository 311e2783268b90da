package surface

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"

	"iop/internal/jsonscan"
)

// Disposition says what the run path does with one request field (no
// request field is accepted and silently dropped; docs/surfaces.md lists
// every table's).
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
// Shape, no Member of it: "foo", "messages[0].content[1].foo"; otherwise
// nil. It is the check of RejectUnknown (ScanMembers). body must already
// be valid JSON (the HTTP layer checks it before parsing anything); a body
// that is not an object yields nil, for the decoder to report. It
// allocates nothing unless a key is written with escapes or a member is
// unknown.
func CheckMembers(body []byte, table []Field) *Error {
	return ScanMembers(body, table, RejectUnknown, nil)
}

// UnknownFields is the run path's policy for a request member that no
// table row or Shape knows (edge config http.unknown_fields). Known
// members keep their row's Disposition under both.
type UnknownFields uint8

const (
	// ReportUnknown ("report", the default): the member is accepted, not
	// sent to the backend, and reported (Ignored): clients send this
	// month's fields of their vendor's API to any base URL, and a field
	// whose only effect is on the vendor's own service must not cost the
	// client its answer. Content the model reads is never dropped: an
	// unknown type of message, content block, input item or tool is a 400
	// naming it under both policies (the parsers refuse types by name).
	ReportUnknown UnknownFields = iota
	// RejectUnknown ("reject"): the member is a 400 naming its path, as
	// OpenAI's and Anthropic's own APIs answer.
	RejectUnknown
)

// ParseUnknownFields maps the config value ("report", "reject"; "" is
// "report") to the policy; ok is false for any other value.
func ParseUnknownFields(s string) (UnknownFields, bool) {
	switch s {
	case "", "report":
		return ReportUnknown, true
	case "reject":
		return RejectUnknown, true
	}
	return ReportUnknown, false
}

// The bounds of an Ignored report, so that a client sending many or long
// unknown members costs the Edge nothing unbounded: at most MaxIgnored
// paths are kept (Total counts all), each cut to MaxIgnoredPath bytes.
const (
	MaxIgnored     = 8
	MaxIgnoredPath = 96
)

// IgnoredHeader names the response header that lists a request's
// Ignored paths: "Iop-Ignored-Fields: tools[10].defer_loading,
// client_metadata" (comma-separated, at most MaxIgnored, then "+N" for
// the rest).
const IgnoredHeader = "Iop-Ignored-Fields"

// Ignored is what one request carried that the run path accepted and did
// not send to the backend: unknown members (ReportUnknown) and known items
// the backend has no place for (a built-in tool the model cannot call, a
// deferred tool, Anthropic's encrypted redacted_thinking). Each entry is a
// path (sanitized: printable ASCII without ',', '"' or '\\', other
// bytes '?', at most MaxIgnoredPath bytes) and Row, the field table row
// it is under ("" for an unknown top-level member): a bounded label for a
// metric, where the path is the client's own words. The zero value is an
// empty report.
type Ignored struct {
	Fields []IgnoredField
	// Total counts every ignored member, also those beyond MaxIgnored.
	Total int
}

// IgnoredField is one entry of an Ignored report.
type IgnoredField struct {
	Path string
	Row  string
}

// Add records one ignored member at path under table row row.
func (ig *Ignored) Add(path, row string) {
	ig.Total++
	if len(ig.Fields) < MaxIgnored {
		ig.Fields = append(ig.Fields, IgnoredField{Path: sanitizePath(path), Row: row})
	}
}

// Header returns the IgnoredHeader value, "" when nothing was ignored.
func (ig *Ignored) Header() string {
	if ig == nil || ig.Total == 0 {
		return ""
	}
	var b []byte
	for i, f := range ig.Fields {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, f.Path...)
	}
	if more := ig.Total - len(ig.Fields); more > 0 {
		b = append(b, ", +"...)
		b = strconv.AppendInt(b, int64(more), 10)
	}
	return string(b)
}

// sanitizePath bounds p to MaxIgnoredPath bytes with every byte a header
// list or a log line could be split on (control, space, non-ASCII, comma,
// quote, backslash) as '?', and "" as "?".
func sanitizePath(p string) string {
	if p == "" {
		return "?" // a member named "": no empty entry in the list
	}
	if len(p) > MaxIgnoredPath {
		p = p[:MaxIgnoredPath]
	}
	clean := true
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c >= 0x7f || c == ',' || c == '"' || c == '\\' {
			clean = false
			break
		}
	}
	if clean {
		return p
	}
	b := []byte(p)
	for i, c := range b {
		if c <= ' ' || c >= 0x7f || c == ',' || c == '"' || c == '\\' {
			b[i] = '?'
		}
	}
	return string(b)
}

// ScanMembers checks the members of the JSON object body against table
// and its rows' Shapes at any depth. A member neither knows is, with
// RejectUnknown, a 400 naming its path ("foo",
// "messages[0].content[1].foo"); with ReportUnknown it is added to ig (when
// non-nil) and nil is returned. body must be valid JSON; a body that is not
// an object yields nil, for the decoder to report. The members are never
// copied: the parsers decode into structs that have no place for them, so
// an unknown member reaches no backend.
func ScanMembers(body []byte, table []Field, policy UnknownFields, ig *Ignored) *Error {
	it, ok := jsonscan.NewMembers(body, jsonscan.All(body))
	if !ok {
		return nil
	}
	sc := scan{all: policy == ReportUnknown}
	kept := 0 // paths added to ig; the rest of sc.n only counts
	for {
		key, val, more := it.Next()
		if !more {
			if ig != nil {
				ig.Total += sc.n - kept
			}
			return nil
		}
		f := knownKey(key, table)
		var paths []string
		row := ""
		if f == nil {
			if sc.add() {
				paths = []string{jsonscan.Key(key)}
			}
		} else if f.Shape != nil {
			row = f.Name
			for _, p := range f.Shape.check(body, val, &sc) {
				paths = append(paths, f.Name+p)
			}
		}
		if !sc.all && sc.n > 0 {
			name := paths[0]
			return BadRequest(name, "unknown field %q: not a field of this API, or not one the model's provider supports", name)
		}
		if ig != nil {
			for _, p := range paths {
				ig.Add(p, row)
				kept++
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

// DecodeRequest decodes a request body into v under RejectUnknown: every
// member must have a row in table or its Shapes (CheckMembers), nested
// objects are decoded as v's types say (encoding/json). Errors are 400s
// naming the field.
func DecodeRequest(body []byte, v any, table []Field) *Error {
	return DecodeRequestPolicy(body, v, table, RejectUnknown, nil)
}

// DecodeRequestPolicy is DecodeRequest under policy: with ReportUnknown
// the members neither table nor its Shapes know are added to ig and not
// decoded (see ScanMembers).
func DecodeRequestPolicy(body []byte, v any, table []Field, policy UnknownFields, ig *Ignored) *Error {
	if e := ScanMembers(body, table, policy, ig); e != nil {
		return e
	}
	if err := json.Unmarshal(body, v); err != nil {
		return JSONFieldError(err)
	}
	return nil
}
