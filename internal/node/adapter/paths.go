package adapter

import (
	"fmt"
	"net/url"
	"strings"

	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// checkProfile validates every path of a profile with checkRelPath and the
// auth header name.
func checkProfile(p *iop.ConcreteProtocolProfile) error {
	for _, f := range []struct{ name, path string }{
		{"models_path", p.GetModelsPath()},
		{"chat_completions_path", p.GetChatCompletionsPath()},
		{"messages_path", p.GetMessagesPath()},
		{"count_tokens_path", p.GetCountTokensPath()},
		{"responses_path", p.GetResponsesPath()},
		{"completions_path", p.GetCompletionsPath()},
		{"embeddings_path", p.GetEmbeddingsPath()},
		{"health_path", p.GetHealthPath()},
	} {
		if f.path == "" {
			continue
		}
		if err := checkRelPath(f.path); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrBadProfile, f.name, err)
		}
	}
	if h := p.GetAuthHeader(); h != "" && !validToken(h) {
		return fmt.Errorf("%w: auth_header %q is not a header name", ErrBadProfile, h)
	}
	return nil
}

// tunnelPath maps a tunnel request to the path below the base (SPEC T1): the
// profile's path for a named operation, or req.path when the operation is
// empty. The result passed checkRelPath. Errors: errUnknownOperation,
// errUnsupported (the profile has no path for it), errUnsafePath.
func tunnelPath(p *iop.ConcreteProtocolProfile, op, reqPath string) (string, error) {
	var path string
	switch op {
	case "":
		path = reqPath
	case protocol.OpModels:
		path = p.GetModelsPath()
	case protocol.OpChatCompletions:
		path = p.GetChatCompletionsPath()
	case protocol.OpMessages:
		path = p.GetMessagesPath()
	case protocol.OpCountTokens:
		path = p.GetCountTokensPath()
	case protocol.OpResponses:
		path = p.GetResponsesPath()
	case protocol.OpCompletions:
		path = p.GetCompletionsPath()
	case protocol.OpEmbeddings:
		path = p.GetEmbeddingsPath()
	default:
		return "", fmt.Errorf("%w %q (want models, chat_completions, messages, count_tokens, responses, completions or embeddings)", errUnknownOperation, op)
	}
	if op != "" && path == "" {
		return "", fmt.Errorf("%w: profile %q has no %s path", errUnsupported, p.GetName(), op)
	}
	if err := checkRelPath(path); err != nil {
		return "", err
	}
	return path, nil
}

// checkRelPath accepts a path relative to the base: "/v1/models" or
// "v1/models", optionally with a query. It rejects an empty path, an
// absolute URL, a host ("//h/…"), user info, a fragment, backslashes,
// control characters and any "." or ".." segment, also percent-encoded (so
// nothing can escape the base path).
func checkRelPath(p string) error {
	if p == "" {
		return fmt.Errorf("%w: empty path", errUnsafePath)
	}
	if len(p) > 4096 {
		return fmt.Errorf("%w: path longer than 4096 bytes", errUnsafePath)
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c == 0x7f || c == '\\' || c == '#' {
			return fmt.Errorf("%w: %q has a control character, backslash or fragment", errUnsafePath, p)
		}
	}
	if strings.HasPrefix(p, "//") {
		return fmt.Errorf("%w: %q names a host", errUnsafePath, p)
	}
	u, err := url.Parse(p)
	if err != nil {
		return fmt.Errorf("%w: %q: %v", errUnsafePath, p, err)
	}
	if u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return fmt.Errorf("%w: %q is an absolute URL", errUnsafePath, p)
	}
	for _, seg := range strings.Split(u.Path, "/") {
		if seg == "." || seg == ".." {
			return fmt.Errorf("%w: %q has a dot segment", errUnsafePath, p)
		}
	}
	return nil
}
