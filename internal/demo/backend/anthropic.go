package backend

import (
	"net/http"
	"strconv"
)

// llama-server's Anthropic Messages endpoint (sample llama_v1_messages_stream.sse,
// shapes from the Anthropic API reference).

// anthropicFormat renders /v1/messages: named SSE events ending with
// message_delta and message_stop (no [DONE]); tool calls as a tool_use block.
type anthropicFormat struct{}

func (anthropicFormat) contentType() string { return "text/event-stream" }

// head appends the message object's leading fields up to "content":.
func (anthropicFormat) head(c *call, dst []byte) []byte {
	dst = append(dst, `{"id":"chatcmpl-`...)
	dst = append(dst, c.idArr[:]...)
	return append(dst, `","type":"message","role":"assistant","content":`...)
}

func (a anthropicFormat) begin(c *call, dst []byte) []byte {
	dst = append(dst, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":"...)
	dst = a.head(c, dst)
	dst = append(dst, `[],"model":`...)
	dst = append(dst, c.modelJSON...)
	dst = append(dst, `,"stop_reason":null,"stop_sequence":null,"usage":{"cache_read_input_tokens":`...)
	dst = appendAnthropicInput(c, dst)
	dst = append(dst, ",\"output_tokens\":0}}}\n\n"...)
	if c.plan.kind != kindTool {
		dst = append(dst, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"...)
	}
	return dst
}

func (anthropicFormat) chunk(c *call, dst []byte, i int) []byte {
	if c.plan.kind == kindTool {
		dst = append(dst, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\""...)
		dst = append(dst, c.toolArr[:]...)
		dst = append(dst, "\",\"name\":\""...)
		dst = append(dst, c.plan.toolName()...)
		dst = append(dst, "\",\"input\":{}}}\n\n"...)
		dst = append(dst, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":"...)
		dst = appendJSONString(dst, c.plan.toolArgsLlama())
		return append(dst, "}}\n\n"...)
	}
	if _, ok := c.thought(i); ok {
		return dst // llama-server streams reasoning here as a thinking block; the stand-in sends only the text
	}
	dst = append(dst, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\""...)
	dst = append(dst, c.plan.token(i)...)
	return append(dst, "\"}}\n\n"...)
}

func (anthropicFormat) end(c *call, dst []byte) []byte {
	dst = append(dst, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"...)
	dst = append(dst, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\""...)
	dst = append(dst, anthropicStop(c.plan.finish)...)
	dst = append(dst, `","stop_sequence":null},"usage":{"output_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.plan.completion), 10)
	return append(dst, "}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
}

func (a anthropicFormat) whole(c *call, dst []byte, pad int) []byte {
	dst = a.head(c, dst)
	if c.plan.kind == kindTool {
		dst = append(dst, `[{"type":"tool_use","id":"`...)
		dst = append(dst, c.toolArr[:]...)
		dst = append(dst, `","name":"`...)
		dst = append(dst, c.plan.toolName()...)
		dst = append(dst, `","input":`...)
		dst = append(dst, c.plan.toolArgsObject()...)
		dst = append(dst, `}]`...)
	} else {
		dst = append(dst, `[{"type":"text","text":"`...)
		for i := range c.plan.n {
			dst = append(dst, c.plan.token(i)...)
		}
		dst = appendPadding(dst, pad)
		dst = append(dst, `"}]`...)
	}
	dst = append(dst, `,"model":`...)
	dst = append(dst, c.modelJSON...)
	dst = append(dst, `,"stop_reason":"`...)
	dst = append(dst, anthropicStop(c.plan.finish)...)
	dst = append(dst, `","stop_sequence":null,"usage":{"cache_read_input_tokens":`...)
	dst = appendAnthropicInput(c, dst)
	dst = append(dst, `,"output_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.plan.completion), 10)
	return append(dst, `}}`...)
}

// appendAnthropicInput appends `N,"input_tokens":M`: llama-server reports
// the cached prompt tokens as cache_read_input_tokens and only the rest as
// input_tokens.
func appendAnthropicInput(c *call, dst []byte) []byte {
	dst = strconv.AppendInt(dst, int64(c.cached), 10)
	dst = append(dst, `,"input_tokens":`...)
	return strconv.AppendInt(dst, int64(c.prompt-c.cached), 10)
}

func anthropicStop(f finish) string {
	switch f {
	case finishLength:
		return "max_tokens"
	case finishTool:
		return "tool_use"
	}
	return "end_turn"
}

// countTokens serves /v1/messages/count_tokens: {"input_tokens":N} with the
// same prompt estimate as the usage of /v1/messages.
func (c *call) countTokens() {
	if !c.decode(shapeAnthropic) || !c.headerFaults(shapeAnthropic) {
		return
	}
	buf := append(c.buffer(), `{"input_tokens":`...)
	buf = strconv.AppendInt(buf, int64(c.prompt), 10)
	c.writeJSON(http.StatusOK, append(buf, '}'))
}
