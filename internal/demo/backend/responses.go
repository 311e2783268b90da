package backend

import "strconv"

// llamaResponsesFormat renders /v1/responses as llama-server (commit
// e95dae18) does (captures llama_v1_responses_*): `event: <type>` +
// `data: <json>` with "type" first and no sequence numbers or output
// indexes; response.created and response.in_progress carry only id, object
// and status; the text is one message item with one output_text part; a
// tool call is one function_call item whose call_id is "fc_" + 32
// characters and which has no id of its own; the stream ends with the
// *.done events and response.completed (status "completed" even on the
// token limit, as llama-server reports).
type llamaResponsesFormat struct{}

func (llamaResponsesFormat) contentType() string { return "text/event-stream" }

func (llamaResponsesFormat) begin(_ *call, dst []byte) []byte { return dst }

// respEvent appends `event: <typ>\ndata: {"type":"<typ>"`.
func respEvent(dst []byte, typ string) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, typ...)
	dst = append(dst, "\ndata: {\"type\":\""...)
	dst = append(dst, typ...)
	return append(dst, '"')
}

func (llamaResponsesFormat) respID(c *call, dst []byte) []byte {
	dst = append(dst, `"resp_`...)
	dst = append(dst, c.idArr[:]...)
	return append(dst, '"')
}

func (llamaResponsesFormat) msgID(c *call, dst []byte) []byte {
	dst = append(dst, `"msg_`...)
	dst = append(dst, c.toolArr[:]...)
	return append(dst, '"')
}

func (llamaResponsesFormat) callID(c *call, dst []byte) []byte {
	dst = append(dst, `"fc_`...)
	dst = append(dst, c.toolArr[:]...)
	return append(dst, '"')
}

func (l llamaResponsesFormat) chunk(c *call, dst []byte, i int) []byte {
	if i == 0 {
		for _, typ := range [...]string{"response.created", "response.in_progress"} {
			dst = respEvent(dst, typ)
			dst = append(dst, `,"response":{"id":`...)
			dst = l.respID(c, dst)
			dst = append(dst, `,"object":"response","status":"in_progress"}}`+"\n\n"...)
		}
	}
	if c.plan.kind == kindTool {
		dst = respEvent(dst, "response.output_item.added")
		dst = append(dst, `,"item":{"arguments":"","call_id":`...)
		dst = l.callID(c, dst)
		dst = append(dst, `,"name":"`...)
		dst = append(dst, c.plan.toolName()...)
		dst = append(dst, `","type":"function_call","status":"in_progress"}}`+"\n\n"...)
		dst = respEvent(dst, "response.function_call_arguments.delta")
		dst = append(dst, `,"delta":`...)
		dst = appendJSONString(dst, c.plan.toolArgsLlama())
		dst = append(dst, `,"item_id":`...)
		dst = l.callID(c, dst)
		return append(dst, "}\n\n"...)
	}
	if _, ok := c.thought(i); ok {
		return dst // llama-server streams reasoning here as a reasoning item; the stand-in sends only the text
	}
	if i == c.plan.think {
		dst = respEvent(dst, "response.output_item.added")
		dst = append(dst, `,"item":{"content":[],"id":`...)
		dst = l.msgID(c, dst)
		dst = append(dst, `,"role":"assistant","status":"in_progress","type":"message"}}`+"\n\n"...)
		dst = respEvent(dst, "response.content_part.added")
		dst = append(dst, `,"item_id":`...)
		dst = l.msgID(c, dst)
		dst = append(dst, `,"part":{"type":"output_text","text":""}}`+"\n\n"...)
	}
	dst = respEvent(dst, "response.output_text.delta")
	dst = append(dst, `,"item_id":`...)
	dst = l.msgID(c, dst)
	dst = append(dst, `,"delta":"`...)
	dst = append(dst, c.plan.token(i)...)
	return append(dst, "\"}\n\n"...)
}

// text appends the whole answer (JSON-escaped, without quotes).
func (llamaResponsesFormat) text(c *call, dst []byte, pad int) []byte {
	for i := range c.plan.n {
		dst = append(dst, c.plan.token(i)...)
	}
	return appendPadding(dst, pad)
}

// textPart appends the output_text part holding the whole answer.
func (l llamaResponsesFormat) textPart(c *call, dst []byte, pad int) []byte {
	dst = append(dst, `{"type":"output_text","annotations":[],"logprobs":[],"text":"`...)
	dst = l.text(c, dst, pad)
	return append(dst, `"}`...)
}

// callItem appends the completed function_call item in the stream's key
// order.
func (l llamaResponsesFormat) callItem(c *call, dst []byte) []byte {
	dst = append(dst, `{"type":"function_call","status":"completed","arguments":`...)
	dst = appendJSONString(dst, c.plan.toolArgsLlama())
	dst = append(dst, `,"call_id":`...)
	dst = l.callID(c, dst)
	dst = append(dst, `,"name":"`...)
	dst = append(dst, c.plan.toolName()...)
	return append(dst, `"}`...)
}

// messageItem appends the completed message item in the stream's key
// order.
func (l llamaResponsesFormat) messageItem(c *call, dst []byte) []byte {
	dst = append(dst, `{"type":"message","status":"completed","id":`...)
	dst = l.msgID(c, dst)
	dst = append(dst, `,"content":[`...)
	dst = l.textPart(c, dst, 0)
	return append(dst, `],"role":"assistant"}`...)
}

func (llamaResponsesFormat) usage(c *call, dst []byte) []byte {
	dst = append(dst, `"usage":{"input_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.prompt), 10)
	dst = append(dst, `,"output_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.plan.completion), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.prompt+c.plan.completion), 10)
	return append(dst, `,"input_tokens_details":{"cached_tokens":0}}`...)
}

func (l llamaResponsesFormat) end(c *call, dst []byte) []byte {
	var item []byte
	if c.plan.kind == kindTool {
		item = l.callItem(c, nil)
	} else {
		dst = respEvent(dst, "response.output_text.done")
		dst = append(dst, `,"item_id":`...)
		dst = l.msgID(c, dst)
		dst = append(dst, `,"text":"`...)
		dst = l.text(c, dst, 0)
		dst = append(dst, "\"}\n\n"...)
		dst = respEvent(dst, "response.content_part.done")
		dst = append(dst, `,"item_id":`...)
		dst = l.msgID(c, dst)
		dst = append(dst, `,"part":`...)
		dst = l.textPart(c, dst, 0)
		dst = append(dst, "}\n\n"...)
		item = l.messageItem(c, nil)
	}
	dst = respEvent(dst, "response.output_item.done")
	dst = append(dst, `,"item":`...)
	dst = append(dst, item...)
	dst = append(dst, "}\n\n"...)
	dst = respEvent(dst, "response.completed")
	dst = append(dst, `,"response":{"id":`...)
	dst = l.respID(c, dst)
	dst = append(dst, `,"object":"response","created_at":`...)
	dst = strconv.AppendInt(dst, c.clock().Unix(), 10)
	dst = append(dst, `,"status":"completed","model":`...)
	dst = append(dst, c.modelJSON...)
	dst = append(dst, `,"output":[`...)
	dst = append(dst, item...)
	dst = append(dst, `],`...)
	dst = l.usage(c, dst)
	return append(dst, "}}\n\n"...)
}

// whole renders the non-stream response: keys in sorted order at the top
// level and in the message item, as llama-server writes it.
func (l llamaResponsesFormat) whole(c *call, dst []byte, pad int) []byte {
	t := c.clock().Unix()
	dst = append(dst, `{"completed_at":`...)
	dst = strconv.AppendInt(dst, t, 10)
	dst = append(dst, `,"created_at":`...)
	dst = strconv.AppendInt(dst, t, 10)
	dst = append(dst, `,"id":`...)
	dst = l.respID(c, dst)
	dst = append(dst, `,"model":`...)
	dst = append(dst, c.modelJSON...)
	dst = append(dst, `,"object":"response","output":[`...)
	if c.plan.kind == kindTool {
		dst = l.callItem(c, dst)
	} else {
		dst = append(dst, `{"content":[`...)
		dst = l.textPart(c, dst, pad)
		dst = append(dst, `],"id":`...)
		dst = l.msgID(c, dst)
		dst = append(dst, `,"role":"assistant","status":"completed","type":"message"}`...)
	}
	dst = append(dst, `],"status":"completed",`...)
	dst = l.usage(c, dst)
	return append(dst, '}')
}
