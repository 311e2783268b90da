package api

import (
	"slices"
	"strconv"
	"testing"

	"iop/internal/edge/keys"
	"iop/internal/edge/keystore"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// K6, T2: with API keys on, a tunnelled answer carries the key's own
// rate-limit headers and none of the upstream's (they describe the
// upstream account every key shares: relayed, they told one key how much
// the others use, and stood beside the key's values under the same names,
// "X-Ratelimit-Remaining-Tokens: 729, 149984"); a key without limits gets
// none at all. In open mode (one tenant) the upstream's pass. The other
// relayed headers pass either way.
func TestTunnelRateLimitHeadersAreTheKeys(t *testing.T) {
	upstream := []*iop.Header{{Name: "Content-Type", Value: "application/json"},
		{Name: "X-Ratelimit-Remaining-Tokens", Value: "149984"}, {Name: "x-ratelimit-limit-requests", Value: "500"},
		{Name: "Anthropic-Ratelimit-Tokens-Remaining", Value: "7"}, {Name: "Openai-Processing-Ms", Value: "42"}}
	rows := []struct {
		name string
		spec *keystore.Spec // nil = open mode
		want map[string][]string
	}{
		{"K6 a key with limits: its own values only", &keystore.Spec{Name: "a", Limits: keystore.Limits{RequestsPerMinute: 60, TokensPerMinute: 1000}},
			map[string][]string{"X-Ratelimit-Limit-Requests": {"60"}, "X-Ratelimit-Remaining-Tokens": {strconv.FormatInt(1000-keys.Estimate(len(chatBody), 0), 10)},
				"Anthropic-Ratelimit-Tokens-Remaining": nil, "Openai-Processing-Ms": {"42"}}},
		{"K6 a key without limits: none of the upstream account's", &keystore.Spec{Name: "a"},
			map[string][]string{"X-Ratelimit-Limit-Requests": nil, "X-Ratelimit-Remaining-Tokens": nil, "Anthropic-Ratelimit-Tokens-Remaining": nil,
				"Openai-Processing-Ms": {"42"}}},
		{"T2 open mode: the upstream's pass", nil,
			map[string][]string{"X-Ratelimit-Limit-Requests": {"500"}, "X-Ratelimit-Remaining-Tokens": {"149984"},
				"Anthropic-Ratelimit-Tokens-Remaining": {"7"}, "Openai-Processing-Ms": {"42"}}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			var r *rig
			var hdr []string
			if row.spec != nil {
				var sec map[string]string
				r, _, sec = newKeysRig(t, *row.spec)
				hdr = []string{"Authorization", "Bearer " + sec["a"]}
			} else {
				r = newRig(t, protocol.TypeOpenAICompat, nil)
			}
			r.st.frames(&iop.ProviderTunnelFrame{Seq: 1, Kind: iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START, Status: 200, Headers: upstream},
				&iop.ProviderTunnelFrame{Seq: 2, Kind: iop.TunnelFrameKind_TUNNEL_FRAME_BODY, Body: []byte(`{}`)},
				&iop.ProviderTunnelFrame{Seq: 3, Kind: iop.TunnelFrameKind_TUNNEL_FRAME_END})
			resp, body := r.do(t, "POST", "/v1/chat/completions", chatBody, hdr...)
			if resp.StatusCode != 200 || body != "{}" {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			for name, want := range row.want {
				if got := resp.Header.Values(name); !slices.Equal(got, want) {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
		})
	}
}
