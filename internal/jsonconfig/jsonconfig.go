// Package jsonconfig decodes JSON configuration files strictly: every unknown
// key is an error naming its full path (e.g.
// "nodes[0].adapters[1].capacty: unknown field"), and all of them are
// reported at once. It owns decoding only; validation of values belongs to
// each config package, and naming the file (an edge config, a key store)
// to the caller: a problem without a key path (invalid JSON) names none.
package jsonconfig

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// Errors is a list of problems found in one config, each naming its key
// path. It implements error; its message has one problem per line.
type Errors []string

func (e Errors) Error() string { return strings.Join(e, "\n") }

// Decode parses data into v (a pointer to a struct) strictly. Syntax errors
// report line and column; unknown keys and type mismatches report their key
// path. usable reports whether v was filled (the JSON was well-formed and
// every value had the right type), so the caller can validate it and report
// its problems together with the unknown keys.
func Decode(data []byte, v any) (errs Errors, usable bool) {
	var tree any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&tree); err != nil {
		return Errors{syntaxMessage(data, err)}, false
	}
	if dec.More() {
		return Errors{"trailing data after the top-level JSON value"}, false
	}
	if _, ok := tree.(map[string]any); !ok {
		return Errors{"top level must be a JSON object"}, false
	}
	var mismatched bool
	walk(reflect.TypeOf(v).Elem(), tree, "", &errs, &mismatched)
	if err := json.Unmarshal(data, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			if mismatched {
				return errs, false // walk named every mismatch with its full path
			}
			return append(errs, fmt.Sprintf("%s: want %s, got JSON %s", te.Field, te.Type, te.Value)), false
		}
		return append(errs, err.Error()), false
	}
	return errs, !mismatched
}

func syntaxMessage(data []byte, err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		line, col := position(data, se.Offset)
		return fmt.Sprintf("invalid JSON at line %d, column %d: %v", line, col, err)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return "invalid JSON: unexpected end of input"
	}
	return "invalid JSON: " + err.Error()
}

func position(data []byte, off int64) (line, col int) {
	line, col = 1, 1
	for i := int64(0); i < off && i < int64(len(data)); i++ {
		if data[i] == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return line, col
}

// walk reports keys in node that t (after pointer indirection) does not
// declare, and values whose JSON type t cannot hold, each with its full
// path ("nodes[0].adapters[1].capacity: want int, got JSON string"), as
// json.Unmarshal's own type error names only the first one and without
// indices. A mismatch sets *mismatched. JSON null is left alone (it
// leaves the field as it is).
func walk(t reflect.Type, node any, path string, errs *Errors, mismatched *bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if node == nil {
		return
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) || reflect.PointerTo(t).Implements(textUnmarshalerType) {
		return // its own decoder checks it (time.Time: an RFC 3339 string); Decode reports its error
	}
	if want := mismatch(t, node); want != "" {
		*errs = append(*errs, fmt.Sprintf("%s: want %s, got JSON %s", path, want, jsonKind(node)))
		*mismatched = true
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := node.(map[string]any)
		if !ok {
			return
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				*errs = append(*errs, join(path, k)+": unknown field")
				continue
			}
			walk(ft, obj[k], join(path, k), errs, mismatched)
		}
	case reflect.Slice, reflect.Array:
		arr, ok := node.([]any)
		if !ok {
			return
		}
		for i, el := range arr {
			walk(t.Elem(), el, fmt.Sprintf("%s[%d]", path, i), errs, mismatched)
		}
	case reflect.Map:
		obj, ok := node.(map[string]any)
		if !ok {
			return
		}
		for k, el := range obj {
			walk(t.Elem(), el, join(path, k), errs, mismatched)
		}
	}
}

var (
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// mismatch returns what t wants when the decoded JSON value node (from a
// decoder with UseNumber) cannot be unmarshaled into it, else "".
func mismatch(t reflect.Type, node any) string {
	switch t.Kind() {
	case reflect.String:
		if _, ok := node.(string); !ok {
			return "string"
		}
	case reflect.Bool:
		if _, ok := node.(bool); !ok {
			return "bool"
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := node.(json.Number)
		if !ok {
			return "an integer"
		}
		if i, err := n.Int64(); err != nil || reflect.Zero(t).OverflowInt(i) {
			return fmt.Sprintf("an integer that fits %s", t.Kind())
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, ok := node.(json.Number)
		if !ok {
			return "a non-negative integer"
		}
		if u, err := strconv.ParseUint(n.String(), 10, 64); err != nil || reflect.Zero(t).OverflowUint(u) {
			return fmt.Sprintf("a non-negative integer that fits %s", t.Kind())
		}
	case reflect.Float32, reflect.Float64:
		if _, ok := node.(json.Number); !ok {
			return "a number"
		}
	case reflect.Struct, reflect.Map:
		if _, ok := node.(map[string]any); !ok {
			return "an object"
		}
	case reflect.Slice, reflect.Array:
		if _, ok := node.([]any); !ok {
			return "an array"
		}
	}
	return ""
}

// jsonKind names the JSON type of a decoded value, with a number's text.
func jsonKind(node any) string {
	switch v := node.(type) {
	case string:
		return "string"
	case bool:
		return "bool"
	case json.Number:
		return "number " + v.String()
	case map[string]any:
		return "object"
	case []any:
		return "array"
	}
	return "value"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// jsonFields maps JSON names to field types, following encoding/json's rules
// for tags and exported fields (embedded structs are flattened).
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := make(map[string]reflect.Type)
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range jsonFields(ft) {
					out[k] = v
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}
