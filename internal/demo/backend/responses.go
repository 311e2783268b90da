package backend

import "strconv"

// llamaResponsesFormat renders /v1/responses as llama-server (commit
// e95dae18, tools/server/server-task.cpp) does: events as `event: <type>`
// + `data: <json>` with the keys in sorted order (nlohmann::json), no
// sequence numbers or output indexes; response.created and
// response.in_progress carry only id, object and status; the text item is
// message + output_text, a tool call one function_call item whose call_id
// is "fc_" + the call id and which has no id of its own; the stream ends
// with the *.done events and response.completed (status "completed" even on
// the token limit, as llama-server reports).
type llamaResponsesFormat struct{}

func (llamaResponsesFormat) contentType() string { return "text/event-stream" }

func (llamaResponsesFormat) begin(_ *call, dst []byte) []byte { return dst }

func respEvent(dst []byte, typ string) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, typ...)
	return append(dst, "\ndata: "...)
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
			dst = append(dst, `{"response":{"id":"resp_`...)
			dst = append(dst, c.idArr[:]...)
			dst = append(dst, `","object":"response","status":"in_progress"},"type":"`...)
			dst = append(dst, typ...)
			dst = append(dst, "\"}\n\n"...)
		}
	}
	if c.plan.kind == kindTool {
		dst = respEvent(dst, "response.output_item.added")
		dst = append(dst, `{"item":{"arguments":"","call_id":`...)
		dst = l.callID(c, dst)
		dst = append(dst, `,"name":"`+toolName+`","status":"in_progress","type":"function_call"},"type":"response.output_item.added"}`+"\n\n"...)
		dst = respEvent(dst, "response.function_call_arguments.delta")
		dst = append(dst, `{"delta":`...)
		dst = appendJSONString(dst, toolArgsLlama)
		dst = append(dst, `,"item_id":`...)
		dst = l.callID(c, dst)
		return append(dst, `,"type":"response.function_call_arguments.delta"}`+"\n\n"...)
	}
	if i == 0 {
		dst = respEvent(dst, "response.output_item.added")
		dst = append(dst, `{"item":{"content":[],"id":`...)
		dst = l.msgID(c, dst)
		dst = append(dst, `,"role":"assistant","status":"in_progress","type":"message"},"type":"response.output_item.added"}`+"\n\n"...)
		dst = respEvent(dst, "response.content_part.added")
		dst = append(dst, `{"item_id":`...)
		dst = l.msgID(c, dst)
		dst = append(dst, `,"part":{"text":"","type":"output_text"},"type":"response.content_part.added"}`+"\n\n"...)
	}
	dst = respEvent(dst, "response.output_text.delta")
	dst = append(dst, `{"delta":"`...)
	dst = append(dst, c.plan.token(i)...)
	dst = append(dst, `","item_id":`...)
	dst = l.msgID(c, dst)
	return append(dst, `,"type":"response.output_text.delta"}`+"\n\n"...)
}

// textPart appends the output_text part holding the whole answer.
func (llamaResponsesFormat) textPart(c *call, dst []byte, pad int) []byte {
	dst = append(dst, `{"annotations":[],"logprobs":[],"text":"`...)
	for i := range c.plan.n {
		dst = append(dst, c.plan.token(i)...)
	}
	dst = appendPadding(dst, pad)
	return append(dst, `","type":"output_text"}`...)
}

// callItem appends the completed function_call item.
func (l llamaResponsesFormat) callItem(c *call, dst []byte) []byte {
	dst = append(dst, `{"arguments":`...)
	dst = appendJSONString(dst, toolArgsLlama)
	dst = append(dst, `,"call_id":`...)
	dst = l.callID(c, dst)
	return append(dst, `,"name":"`+toolName+`","status":"completed","type":"function_call"}`...)
}

// output appends the response's output array.
func (l llamaResponsesFormat) output(c *call, dst []byte, pad int) []byte {
	dst = append(dst, '[')
	if c.plan.kind == kindTool {
		dst = l.callItem(c, dst)
	} else {
		dst = append(dst, `{"content":[`...)
		dst = l.textPart(c, dst, pad)
		dst = append(dst, `],"id":`...)
		dst = l.msgID(c, dst)
		dst = append(dst, `,"role":"assistant","status":"completed","type":"message"}`...)
	}
	return append(dst, ']')
}

func (llamaResponsesFormat) usage(c *call, dst []byte) []byte {
	dst = append(dst, `"usage":{"input_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.prompt), 10)
	dst = append(dst, `,"input_tokens_details":{"cached_tokens":0},"output_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.plan.completion), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.prompt+c.plan.completion), 10)
	return append(dst, '}')
}

func (l llamaResponsesFormat) end(c *call, dst []byte) []byte {
	if c.plan.kind == kindTool {
		dst = respEvent(dst, "response.output_item.done")
		dst = append(dst, `{"item":`...)
		dst = l.callItem(c, dst)
		dst = append(dst, `,"type":"response.output_item.done"}`+"\n\n"...)
	} else {
		dst = respEvent(dst, "response.output_text.done")
		dst = append(dst, `{"item_id":`...)
		dst = l.msgID(c, dst)
		dst = append(dst, `,"text":"`...)
		for i := range c.plan.n {
			dst = append(dst, c.plan.token(i)...)
		}
		dst = append(dst, `","type":"response.output_text.done"}`+"\n\n"...)
		dst = respEvent(dst, "response.content_part.done")
		dst = append(dst, `{"item_id":`...)
		dst = l.msgID(c, dst)
		dst = append(dst, `,"part":`...)
		dst = l.textPart(c, dst, 0)
		dst = append(dst, `,"type":"response.content_part.done"}`+"\n\n"...)
		dst = respEvent(dst, "response.output_item.done")
		dst = append(dst, `{"item":{"content":[`...)
		dst = l.textPart(c, dst, 0)
		dst = append(dst, `],"id":`...)
		dst = l.msgID(c, dst)
		dst = append(dst, `,"role":"assistant","status":"completed","type":"message"},"type":"response.output_item.done"}`+"\n\n"...)
	}
	dst = respEvent(dst, "response.completed")
	dst = append(dst, `{"response":{"created_at":`...)
	dst = strconv.AppendInt(dst, c.clock().Unix(), 10)
	dst = append(dst, `,"id":"resp_`...)
	dst = append(dst, c.idArr[:]...)
	dst = append(dst, `","model":`...)
	dst = append(dst, c.modelJSON...)
	dst = append(dst, `,"object":"response","output":`...)
	dst = l.output(c, dst, 0)
	dst = append(dst, `,"status":"completed",`...)
	dst = l.usage(c, dst)
	return append(dst, `},"type":"response.completed"}`+"\n\n"...)
}

func (l llamaResponsesFormat) whole(c *call, dst []byte, pad int) []byte {
	t := c.clock().Unix()
	dst = append(dst, `{"completed_at":`...)
	dst = strconv.AppendInt(dst, t, 10)
	dst = append(dst, `,"created_at":`...)
	dst = strconv.AppendInt(dst, t, 10)
	dst = append(dst, `,"id":"resp_`...)
	dst = append(dst, c.idArr[:]...)
	dst = append(dst, `","model":`...)
	dst = append(dst, c.modelJSON...)
	dst = append(dst, `,"object":"response","output":`...)
	dst = l.output(c, dst, pad)
	dst = append(dst, `,"status":"completed",`...)
	dst = l.usage(c, dst)
	return append(dst, '}')
}
