package api

import (
	"iop/internal/edge/exchange"
	"iop/internal/edge/reply"
	"iop/internal/protocol"
)

// endpoint describes one model-serving route: what its exchange needs
// (exchange.Endpoint) and the required array field ("messages"), if any,
// that the head parse checks.
type endpoint struct {
	exchange.Endpoint
	field string
}

var (
	epChat = endpoint{exchange.Endpoint{Surface: reply.OpenAI, Operation: protocol.OpChatCompletions,
		Path: "/v1/chat/completions", Run: exchange.RunChat}, "messages"}
	epResponses = endpoint{exchange.Endpoint{Surface: reply.OpenAI, Operation: protocol.OpResponses,
		Path: "/v1/responses", Run: exchange.RunResponses}, ""}
	epMessages = endpoint{exchange.Endpoint{Surface: reply.Anthropic, Operation: protocol.OpMessages,
		Path: "/v1/messages", Run: exchange.RunMessages}, "messages"}
	epCountTokens = endpoint{exchange.Endpoint{Surface: reply.Anthropic, Operation: protocol.OpCountTokens,
		Path: "/v1/messages/count_tokens", Run: exchange.RunCountTokens}, "messages"}
	epCompletions = endpoint{exchange.Endpoint{Surface: reply.OpenAI, Operation: protocol.OpCompletions,
		Path: "/v1/completions", Run: exchange.RunNone}, ""}
	epEmbeddings = endpoint{exchange.Endpoint{Surface: reply.OpenAI, Operation: protocol.OpEmbeddings,
		Path: "/v1/embeddings", Run: exchange.RunEmbeddings}, ""}
)
