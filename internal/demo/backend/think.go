package backend

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// tiny-think: a model that reasons before it answers, in the thinking
// formats of the real servers.
//
// Ollama 0.17.4 (api/types.go api.Message, server/routes.go ChatHandler):
// a thinking model's stream carries its reasoning as message.thinking on
// lines of their own, with "content":"" (Message's field order: role,
// content, thinking), before the content lines; the non-stream answer has
// both in one message. "think" is a boolean or "low"/"medium"/"high";
// think false turns the reasoning off; think on a model without the
// "thinking" capability is a 400 {"error":"\"<model>\" does not support
// thinking"}, and /api/show lists the capabilities. A level is taken only
// by a model the harmony parser reads (the gpt-oss family); on any other
// thinking model, as tiny-think is (family "llama", like qwen3 or
// deepseek-r1), it is a 400 {"error":"think value \"high\" is not
// supported for this model"}.
//
// llama-server e95dae18 (tools/server/server-chat.cpp
// server_chat_msg_diff_to_json_oaicompat, common/chat.cpp): the
// OpenAI-compatible chat stream carries it as delta.reasoning_content, the
// message as message.reasoning_content (after content).

// thinkTokens is tiny-think's fixed reasoning, one entry per token (no
// character needs JSON escaping).
func thinkTokens() []string {
	return []string{"The", " user", " wants", " a", " greeting.", " I", " will", " say", " hello."}
}

// thinkValue reports whether the request sets "think", whether it asks
// for reasoning (true or a level; false turns it off) and whether it is a
// level (a JSON string).
func thinkValue(raw json.RawMessage) (set, enabled, level bool) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || string(t) == "null" {
		return false, false, false
	}
	return true, string(t) != "false", t[0] == '"'
}

// thinkPlan applies "think" on /api/chat: a 400 when the model cannot
// think and think asks for it, or when think is a level (Ollama's answers,
// in its order), no reasoning with think false. It answers the error
// itself and returns false then.
func (c *call) thinkPlan(sh shape) bool {
	if sh != shapeOllama {
		return true
	}
	set, enabled, level := thinkValue(c.req.Think)
	switch {
	case enabled && !c.m.think:
		c.writeError(sh, http.StatusBadRequest, strconv.Quote(c.req.Model)+" does not support thinking", ErrBadRequest)
		return false
	case level:
		c.writeError(sh, http.StatusBadRequest, "think value "+string(bytes.TrimSpace(c.req.Think))+" is not supported for this model", ErrBadRequest)
		return false
	case set && !enabled && c.plan.think > 0:
		c.plan.n -= c.plan.think
		c.plan.completion -= c.plan.think
		c.plan.think = 0
	}
	return true
}

// thought returns reasoning chunk i, ok false for a content chunk.
func (c *call) thought(i int) (string, bool) {
	if i >= c.plan.think {
		return "", false
	}
	return c.b.script.think[i], true
}

// appendThoughts appends the whole reasoning (JSON-escaped text, no quotes).
func (c *call) appendThoughts(dst []byte) []byte {
	for i := range c.plan.think {
		dst = append(dst, c.b.script.think[i]...)
	}
	return dst
}

// show serves POST /api/show {"model"}: the model's details and
// capabilities, the fields of Ollama 0.17.4's api.ShowResponse a client
// reads to decide what to ask ("completion", "tools" for the tool and agent
// models, "thinking" for tiny-think).
func (c *call) show() {
	if !c.decode(shapeOllama) {
		return
	}
	buf := append(c.buffer(), `{"modelfile":"","parameters":"","template":"{{ .Prompt }}","details":`...)
	buf = appendDetails(buf, c.m)
	buf = append(buf, `,"model_info":{},"capabilities":["completion"`...)
	if c.m.kind == kindTool || c.m.kind == kindAgent {
		buf = append(buf, `,"tools"`...)
	}
	if c.m.think {
		buf = append(buf, `,"thinking"`...)
	}
	buf = append(buf, `],"modified_at":"`+c.m.modified+`"}`...)
	c.writeJSON(http.StatusOK, buf)
}
