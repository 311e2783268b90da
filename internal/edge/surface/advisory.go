package surface

import (
	"encoding/json"
	"unicode/utf8"
)

// The limits of a request's "metadata" in OpenAI's API reference ("Set of
// 16 key-value pairs … keys are strings with a maximum length of 64
// characters. Values are strings with a maximum length of 512
// characters").
const (
	MaxMetadataPairs  = 16
	MaxMetadataKey    = 64
	MaxMetadataValue  = 512
	maxAnthropicUser  = 256 // Anthropic's metadata.user_id
	metadataTypeError = "field %q must be an object of at most 16 string values (keys up to 64 characters, values up to 512)"
)

// CheckMetadata checks an OpenAI "metadata" value (raw JSON, absent or
// null allowed) against the API's limits. It is advisory on the run path
// (tags for stored objects; nothing is stored, no backend takes them), but
// a value the API would refuse is a 400 naming field, never accepted and
// ignored.
func CheckMetadata(field string, raw json.RawMessage) *Error {
	if !Present(raw) {
		return nil
	}
	var m map[string]string
	if raw[0] != '{' || json.Unmarshal(raw, &m) != nil || len(m) > MaxMetadataPairs {
		return BadRequest(field, metadataTypeError, field)
	}
	for k, v := range m {
		if utf8.RuneCountInString(k) > MaxMetadataKey || utf8.RuneCountInString(v) > MaxMetadataValue {
			return BadRequest(field, metadataTypeError, field)
		}
	}
	return nil
}

// OneOf returns a 400 naming field unless v is absent (nil) or one of
// allowed.
func OneOf(field string, v *string, allowed ...string) *Error {
	if v == nil {
		return nil
	}
	for _, a := range allowed {
		if *v == a {
			return nil
		}
	}
	return BadRequest(field, "field %q: %q is not one of %q", field, *v, allowed)
}

// AnthropicMetadata is the "metadata" of an Anthropic Messages request:
// user_id only (Anthropic refuses any other member). Advisory on the run
// path: an end-user id for Anthropic's abuse detection, which no backend
// takes.
type AnthropicMetadata struct {
	UserID *string `json:"user_id"`
}

// Check returns a 400 when user_id is longer than Anthropic allows.
func (m *AnthropicMetadata) Check() *Error {
	if m != nil && m.UserID != nil && utf8.RuneCountInString(*m.UserID) > maxAnthropicUser {
		return BadRequest("metadata", "field \"metadata.user_id\" must be at most 256 characters")
	}
	return nil
}

// InRange returns a 400 naming field unless v is absent (nil) or within
// [lo, hi] (the range the API reference gives for a sampling parameter;
// Ollama would take any number, so a client's mistake would otherwise be
// answered as if it were meant).
func InRange(field string, v *float64, lo, hi float64) *Error {
	if v == nil || (*v >= lo && *v <= hi) {
		return nil
	}
	return BadRequest(field, "field %q must be between %g and %g, got %g", field, lo, hi, *v)
}
