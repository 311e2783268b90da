package openai

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"strconv"

	"iop/internal/edge/surface"
	iop "iop/proto/gen/iop"
)

// embeddingsRequest is an OpenAI embeddings request (OpenAI API reference,
// "Create embeddings"): every documented field; EmbeddingsFields says what
// the run path does with each.
type embeddingsRequest struct {
	Model          json.RawMessage `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat *string         `json:"encoding_format"`
	Dimensions     *int64          `json:"dimensions"`
	User           *string         `json:"user"`
}

// EmbeddingsFields is the run path's table of embeddings request fields
// (no field is accepted and silently dropped): every field
// embeddingsRequest parses has a row; docs/surfaces.md shows them.
var EmbeddingsFields = []surface.Field{
	surface.Row("model", surface.Routing, "selects the model group; the provider's target replaces it"),
	surface.Row("input", surface.Translated, "Ollama's /api/embed input: a string or an array of strings (token arrays are refused: Ollama embeds text)"),
	surface.Row("encoding_format", surface.Translated, "float, or base64 of little-endian float32s, encoded by the edge"),
	surface.Row("dimensions", surface.Translated, "Ollama's /api/embed dimensions"),
	surface.Row("user", surface.Advisory, "an end-user id (a string) for the API provider's abuse monitoring; no backend takes one"),
}

// EmbeddingsRequestFields lists the JSON names of every field the
// embeddings parser knows (for the field-table test).
func EmbeddingsRequestFields() []string { return surface.JSONNames(embeddingsRequest{}) }

// EmbeddingsInput turns an embeddings body into a RunInput for the run
// path's "embeddings" operation (embed_input, dimensions) and reports
// whether the client wants base64. Errors are 400s naming the field.
func EmbeddingsInput(body []byte) (in *iop.RunInput, base64Out bool, e *surface.Error) {
	var req embeddingsRequest
	if e := surface.DecodeRequest(body, &req, EmbeddingsFields); e != nil {
		return nil, false, e
	}
	in = &iop.RunInput{}
	raw := req.Input
	switch {
	case !surface.Present(raw):
		return nil, false, surface.BadRequest("input", "missing required field \"input\"")
	case raw[0] == '"':
		var s string
		_ = json.Unmarshal(raw, &s)
		if s == "" {
			return nil, false, surface.BadRequest("input", "field \"input\" must not be an empty string")
		}
		in.EmbedInput = []string{s}
	case raw[0] == '[':
		if json.Unmarshal(raw, &in.EmbedInput) != nil {
			return nil, false, surface.BadRequest("input", "field \"input\": only a string or an array of strings is supported by this model's provider (no token arrays)")
		}
		if len(in.EmbedInput) == 0 {
			return nil, false, surface.BadRequest("input", "field \"input\" must not be empty")
		}
		for i, x := range in.EmbedInput {
			if x == "" {
				return nil, false, surface.BadRequest("input", "input[%d] must not be an empty string", i)
			}
		}
	default:
		return nil, false, surface.BadRequest("input", "field \"input\" must be a string or an array of strings")
	}
	if f := req.EncodingFormat; f != nil {
		switch *f {
		case "float":
		case "base64":
			base64Out = true
		default:
			return nil, false, surface.BadRequest("encoding_format", "field \"encoding_format\": want \"float\" or \"base64\", got %q", *f)
		}
	}
	if req.Dimensions != nil {
		if *req.Dimensions < 1 {
			return nil, false, surface.BadRequest("dimensions", "field \"dimensions\" must be at least 1")
		}
		in.Dimensions = *req.Dimensions
	}
	return in, base64Out, nil
}

// Embeddings encodes the COMPLETE of an "embeddings" run as OpenAI's
// embeddings list: {"object":"list","data":[{"object":"embedding",
// "index","embedding"}],"model","usage":{"prompt_tokens","total_tokens"}};
// embedding is an array of numbers, or with Base64 the base64 of its
// little-endian float32 bytes (what OpenAI's SDKs decode). It is never
// streamed. The zero value needs Init; not safe for concurrent use.
type Embeddings struct {
	model  string
	base64 bool
}

// Init makes e ready for one response for the client's model name.
func (e *Embeddings) Init(model string, base64Out bool) {
	*e = Embeddings{model: model, base64: base64Out}
}

// Event implements surface.Encoder.
func (e *Embeddings) Event(dst []byte, ev *iop.RunEvent) ([]byte, bool, *surface.Error) {
	if ev.Type != iop.RunEventType_RUN_EVENT_COMPLETE {
		return dst, false, nil
	}
	if len(ev.Embeddings) == 0 {
		return dst, true, surface.BadGateway("provider_error", "the provider returned no embeddings")
	}
	dst = append(dst, `{"object":"list","data":[`...)
	var raw []byte
	for i, emb := range ev.Embeddings {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"object":"embedding","index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		dst = append(dst, `,"embedding":`...)
		if e.base64 {
			raw = raw[:0]
			for _, v := range emb.Values {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(v))
			}
			dst = append(dst, '"')
			dst = base64.StdEncoding.AppendEncode(dst, raw)
			dst = append(dst, '"')
		} else {
			dst = append(dst, '[')
			for j, v := range emb.Values {
				if j > 0 {
					dst = append(dst, ',')
				}
				dst = appendFloat32(dst, v)
			}
			dst = append(dst, ']')
		}
		dst = append(dst, '}')
	}
	dst = append(dst, `],"model":`...)
	dst = surface.AppendString(dst, e.model)
	n := ev.GetUsage().GetPromptTokens()
	dst = append(dst, `,"usage":{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, n, 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, n, 10)
	return append(dst, "}}"...), true, nil
}

// AppendError implements surface.Encoder; embeddings are never streamed.
func (e *Embeddings) AppendError(dst []byte, err *surface.Error) []byte {
	return surface.AppendOpenAIError(dst, err)
}

// appendFloat32 appends v in its shortest float32 form; a value JSON
// cannot hold is 0.
func appendFloat32(b []byte, v float32) []byte {
	if math.IsInf(float64(v), 0) || math.IsNaN(float64(v)) {
		v = 0
	}
	return strconv.AppendFloat(b, float64(v), 'g', -1, 32)
}

var _ surface.Encoder = (*Embeddings)(nil)
