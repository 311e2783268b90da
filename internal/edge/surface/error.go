package surface

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Error is one client-visible failure, the one type of the Edge's client
// errors (a converter's, and every answer internal/edge/reply writes):
// Status is the HTTP status, Type and Code the OpenAI error type and code
// ("" = null), Param the request field at fault ("" = null), Message the
// text a client reads. The Anthropic type derives from Status
// (AnthropicType). RetryAfter, Detail and ClientGone never reach the body.
type Error struct {
	Status  int
	Type    string
	Code    string
	Param   string
	Message string
	// RetryAfter, when > 0, is sent as Retry-After in whole seconds
	// (rounded up, RFC 9110 §10.2.3).
	RetryAfter time.Duration
	// Detail is for the operator's log only: upstream addresses, adapter
	// names and transport errors never reach the client.
	Detail string
	// ClientGone: the client closed the connection before the request
	// was read (its body ended short of Content-Length, or the connection
	// was reset); nobody is left to answer (client_cancelled, 499).
	ClientGone bool
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s", e.Status, e.Message) }

// BadRequest is a 400 invalid_request_error naming param.
func BadRequest(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

// BadGateway is a 502 server_error with code.
func BadGateway(code, msg string) *Error {
	return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: code, Message: msg}
}

// JSONFieldError turns an encoding/json decoding error into a 400 naming
// the field ("messages.role": want a string, got JSON number).
func JSONFieldError(err error) *Error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			return BadRequest("", "request body must be a JSON object")
		}
		return BadRequest(field, "field %q: want %s, got JSON %s", field, jsonTypeName(te.Type.Kind().String()), te.Value)
	case errors.As(err, &se):
		return BadRequest("", "request body is not valid JSON: %v (at byte %d)", se, se.Offset)
	default:
		return BadRequest("", "request body is not valid JSON: %v", err)
	}
}

func jsonTypeName(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	case "bool":
		return "a boolean"
	case "ptr":
		return "a value of another type"
	default:
		return fmt.Sprintf("a number (%s)", goKind)
	}
}

// AnthropicType maps a status to Anthropic's error types (Anthropic API
// reference, "Errors").
func AnthropicType(status int) string {
	switch status {
	case 400:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 503, 529:
		return "overloaded_error"
	case 504:
		return "timeout_error"
	default:
		if status >= 400 && status < 500 {
			return "invalid_request_error"
		}
		return "api_error"
	}
}

// AppendOpenAIError appends e as OpenAI's error object:
// {"error":{"message","type","param","code"}} (param and code null when
// empty).
func AppendOpenAIError(dst []byte, e *Error) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = AppendString(dst, e.Message)
	dst = append(dst, `,"type":`...)
	dst = AppendString(dst, e.Type)
	dst = append(dst, `,"param":`...)
	dst = AppendNullable(dst, e.Param)
	dst = append(dst, `,"code":`...)
	dst = AppendNullable(dst, e.Code)
	return append(dst, "}}"...)
}

// AppendAnthropicError appends e as Anthropic's error object:
// {"type":"error","error":{"type","message"}}.
func AppendAnthropicError(dst []byte, e *Error) []byte {
	dst = append(dst, `{"type":"error","error":{"type":`...)
	dst = AppendString(dst, AnthropicType(e.Status))
	dst = append(dst, `,"message":`...)
	dst = AppendString(dst, e.Message)
	return append(dst, "}}"...)
}
