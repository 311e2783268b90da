package backend

import (
	"encoding/json"
	"slices"
	"strings"
)

// tiny-agent: a model that drives a coding agent through one tool round
// trip, so that ./run.sh e2e can run Claude Code and Codex CLI end to end
// against the stand-in. Asked with the agent's tools, it calls the shell
// tool the agent offers with a harmless command (AgentCommand); asked with
// that call's result as the last turn, it answers "The command printed:
// <the tool's output>". Without a shell tool it answers the fixed text.
//
// The shell tools it knows, with the arguments each agent's schema takes:
// Claude Code's "Bash" {"command","description"}, Codex CLI 0.169's
// "exec_command" {"cmd"}, and the older "shell" {"command":[argv]}.

// AgentCommand is the command tiny-agent asks the agent to run; its output
// is AgentMarker, which the command's own text does not hold (the shell
// computes it), so an answer that repeats it proves the command ran.
const (
	AgentCommand = "echo iop-agent-$((6*7))"
	AgentMarker  = "iop-agent-42"
	// AgentAnswerPrefix starts tiny-agent's final answer.
	AgentAnswerPrefix = "The command printed:"
)

// maxAgentEcho bounds how much of a tool's output the answer repeats
// (bytes).
const maxAgentEcho = 2048

// toolCall is a tool call to make: the function name and its arguments as
// compact JSON object text (no character needs escaping in name).
type toolCall struct {
	name string
	args string
}

var agentShells = []struct{ name, args string }{
	{"Bash", `{"command":"` + AgentCommand + `","description":"Print a marker line"}`},
	{"exec_command", `{"cmd":"` + AgentCommand + `"}`},
	{"shell", `{"command":["bash","-lc","` + AgentCommand + `"]}`},
}

// agentRequest holds what tiny-agent reads of a request in any of the
// chat shapes.
type agentRequest struct {
	Tools []struct {
		Type     string `json:"type"`
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Input json.RawMessage `json:"input"`
}

// agentPlan plans tiny-agent's answer to body (shape sh). The plan owns
// its strings (body is the call's scratch buffer).
func agentPlan(body []byte, sh shape) plan {
	var q agentRequest
	_ = json.Unmarshal(body, &q) // decode already checked it is JSON
	if out, ok := lastToolOutput(&q, sh); ok {
		out = strings.TrimSpace(out)
		if len(out) > maxAgentEcho {
			out = out[:maxAgentEcho]
		}
		toks := wordTokens(AgentAnswerPrefix + " " + out)
		return plan{kind: kindText, tokens: toks, n: len(toks), finish: finishStop, completion: len(toks) + 1}
	}
	var names []string
	for _, t := range q.Tools {
		names = append(names, t.Name, t.Function.Name)
	}
	for _, sh := range agentShells {
		if slices.Contains(names, sh.name) {
			return plan{kind: kindTool, n: 1, finish: finishTool, completion: toolCallTokens,
				call: &toolCall{name: sh.name, args: sh.args}}
		}
	}
	toks := answerTokens()
	return plan{kind: kindText, tokens: toks, n: len(toks), finish: finishStop, completion: len(toks) + 1}
}

// lastToolOutput returns the text of the tool result that ends the
// conversation: a "tool" message (Ollama, OpenAI chat), a user message
// whose last block is a tool_result (Anthropic), or a last
// function_call_output item (Responses).
func lastToolOutput(q *agentRequest, sh shape) (string, bool) {
	if sh == shapeResponses {
		var items []struct {
			Type   string          `json:"type"`
			Output json.RawMessage `json:"output"`
		}
		if json.Unmarshal(q.Input, &items) != nil || len(items) == 0 || items[len(items)-1].Type != "function_call_output" {
			return "", false
		}
		return textOf(items[len(items)-1].Output), true
	}
	if len(q.Messages) == 0 {
		return "", false
	}
	last := q.Messages[len(q.Messages)-1]
	if last.Role == "tool" {
		return textOf(last.Content), true
	}
	if sh != shapeAnthropic || last.Role != "user" {
		return "", false
	}
	var blocks []struct {
		Type    string          `json:"type"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(last.Content, &blocks) != nil || len(blocks) == 0 || blocks[len(blocks)-1].Type != "tool_result" {
		return "", false
	}
	return textOf(blocks[len(blocks)-1].Content), true
}

// textOf reads a content value: a string, or the "text" of an array of
// parts, joined with "\n".
func textOf(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.Text)
	}
	return b.String()
}

// wordTokens splits s into JSON-escaped tokens (each word with the space
// before it), as the fixed answers are split.
func wordTokens(s string) []string {
	var out []string
	start := 0
	for i := 1; i <= len(s); i++ {
		if i == len(s) || s[i] == ' ' {
			esc := appendJSONString(nil, s[start:i])
			out = append(out, string(esc[1:len(esc)-1]))
			start = i
		}
	}
	return out
}

// toolName and toolArgs are the call a tool plan makes: plan.call, else
// the fixed get_weather call; toolArgsLlama is the arguments as
// llama-server spaces them.
func (p *plan) toolName() string {
	if p.call != nil {
		return p.call.name
	}
	return toolName
}

func (p *plan) toolArgsObject() string {
	if p.call != nil {
		return p.call.args
	}
	return toolArgsOllamaJSON
}

func (p *plan) toolArgsLlama() string {
	if p.call != nil {
		return p.call.args
	}
	return toolArgsLlama
}
