package backend

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// embedDims is the width of the stand-in's embeddings: the tiny GGUF
// models' n_embd (128), as real Ollama 0.17.4 returns for them.
const embedDims = 128

// embed answers /api/embed (Ollama 0.17.4: {"model","embeddings":[[…]],
// "total_duration","load_duration","prompt_eval_count"}) and /v1/embeddings
// (Ollama 0.17.4's /v1 shape: {"object":"list","data":[{"object":
// "embedding","embedding":[…],"index"}],"model","usage"}; llama-server
// answers 501 there unless started with --embeddings). Every vector is
// [1,0,0,…] — what the tiny models give for any text — truncated to
// "dimensions" when set.
func (c *call) embed(sh shape) {
	if !c.decode(sh) || !c.headerFaults(sh) {
		return
	}
	inputs, err := embedInputs(c.req.Input)
	if err != nil {
		c.writeError(sh, http.StatusBadRequest, err.Error(), fmt.Errorf("%w: %w", ErrBadRequest, err))
		return
	}
	dims := embedDims
	if d := c.req.Dimensions; d > 0 && d < dims {
		dims = d
	}
	tokens := 0
	for _, s := range inputs {
		tokens += max(1, (len(s)+3)/4)
	}
	c.b.markLoaded(c.m, c.start, c.req.KeepAlive)
	buf := c.buffer()
	if sh == shapeOllama {
		buf = append(buf, `{"model":`...)
		buf = append(buf, c.modelJSON...)
		buf = append(buf, `,"embeddings":[`...)
		for i := range inputs {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendVector(buf, dims)
		}
		now := c.b.now()
		buf = append(buf, `],"total_duration":`...)
		buf = strconv.AppendInt(buf, int64(now.Sub(c.start)), 10)
		buf = append(buf, `,"load_duration":`...)
		buf = strconv.AppendInt(buf, int64(c.decoded.Sub(c.start)), 10)
		buf = append(buf, `,"prompt_eval_count":`...)
		buf = strconv.AppendInt(buf, int64(tokens), 10)
		c.writeJSON(http.StatusOK, append(buf, '}'))
		return
	}
	buf = append(buf, `{"object":"list","data":[`...)
	for i := range inputs {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"object":"embedding","embedding":`...)
		buf = appendVector(buf, dims)
		buf = append(buf, `,"index":`...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		buf = append(buf, '}')
	}
	buf = append(buf, `],"model":`...)
	buf = append(buf, c.modelJSON...)
	buf = append(buf, `,"usage":{"prompt_tokens":`...)
	buf = strconv.AppendInt(buf, int64(tokens), 10)
	buf = append(buf, `,"total_tokens":`...)
	buf = strconv.AppendInt(buf, int64(tokens), 10)
	c.w.Header().Set("Content-Type", "application/json") // Ollama's /v1 sets no charset
	c.writeHeader(http.StatusOK)
	c.out(append(buf, "}}\n"...)) // json.Encoder's newline, as Ollama writes it
}

// embedInputs reads "input": a string or an array of strings.
func embedInputs(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 {
		return nil, fmt.Errorf("input is required")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil || len(many) == 0 {
		return nil, fmt.Errorf("invalid input type")
	}
	return many, nil
}

// appendVector appends [1,0,0,…] of n dimensions.
func appendVector(buf []byte, n int) []byte {
	buf = append(buf, '[', '1')
	for range n - 1 {
		buf = append(buf, ',', '0')
	}
	return append(buf, ']')
}
