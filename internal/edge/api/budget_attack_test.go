package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/dispatch"
	"iop/internal/edge/keys"
	"iop/internal/edge/keystore"
	"iop/internal/leakcheck"
	"iop/internal/protocol"
	iop "iop/proto/gen/iop"
)

// gatedDispatcher gives every tunnel its own stream of frames (made by
// frames), held back until gate is closed: every admitted request is in
// flight at once before any of them settles.
type gatedDispatcher struct {
	mu      sync.Mutex
	frames  func() []*iop.ProviderTunnelFrame
	gate    chan struct{}
	started chan struct{} // one send per tunnel started
	streams []*fakeStream
}

type gatedStream struct {
	*fakeStream
	gate chan struct{}
}

func (s gatedStream) Recv(ctx context.Context) (*iop.Envelope, error) {
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.dead:
		return nil, dispatch.ErrSessionLost
	}
	return s.fakeStream.Recv(ctx)
}

func (s gatedStream) Pending() bool {
	select {
	case <-s.gate:
		return s.fakeStream.Pending()
	default:
		return false
	}
}

func (d *gatedDispatcher) StartRun(dispatch.Target, *iop.RunRequest) (dispatch.Stream, error) {
	return nil, fmt.Errorf("no run path here")
}

func (d *gatedDispatcher) StartTunnel(t dispatch.Target, req *iop.ProviderTunnelRequest) (dispatch.Stream, error) {
	fs := d.frames()
	s := &fakeStream{id: "run", ch: make(chan recvItem, len(fs)+1), cancel: make(chan struct{}), closed: make(chan struct{}), dead: make(chan struct{})}
	s.bind(req.GetAdapter(), req.GetTarget())
	s.frames(fs...)
	d.mu.Lock()
	d.streams = append(d.streams, s)
	d.mu.Unlock()
	d.started <- struct{}{}
	return gatedStream{s, d.gate}, nil
}

func (d *gatedDispatcher) kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.streams {
		s.kill()
	}
}

// sseStream is a tunnelled chat stream of n chunks (one token each) in
// frames of 100 chunks, the frames cut in the middle of an event's blank
// line, with the usage chunk at the end when usage > 0.
func sseStream(n int, usage int64) []*iop.ProviderTunnelFrame {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
	}
	b.WriteString("data: [DONE]\n\n")
	body := b.String()
	fs := []*iop.ProviderTunnelFrame{{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_RESPONSE_START, Status: 200,
		Headers: []*iop.Header{{Name: "Content-Type", Value: "text/event-stream"}}}}
	per := len(body) / max(n/100, 1)
	for len(body) > 0 {
		k := min(per, len(body))
		if i := strings.Index(body[k:], "\n\n"); i >= 0 && k < len(body) {
			k += i + 1 // end the frame between the two newlines
		}
		fs = append(fs, &iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_BODY, Body: []byte(body[:k])})
		body = body[k:]
	}
	if usage > 0 {
		fs = append(fs, &iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_USAGE,
			Usage: &iop.Usage{PromptTokens: 10, CompletionTokens: usage - 10}})
	}
	return append(fs, &iop.ProviderTunnelFrame{Kind: iop.TunnelFrameKind_TUNNEL_FRAME_END})
}

// SPEC K5, attacked: 50 concurrent streams of one key race its token
// budget. A request is admitted only while the budget has something left
// after the others' reservations, so the streams in flight at once are
// ceil(left ÷ estimate) of them, never all 50 (one with a huge
// max_tokens: it alone); a stream is never cut, so what they take past
// the budget is what they took past their estimates, and it is charged:
// the usage the backend reported, or — a tunnelled stream without
// include_usage and without max_tokens, the default estimate of 256 —
// one token per event relayed (before, each cost its estimate: 37
// streams of 2,000 tokens cost 10,212 of a 10,000 budget, so a key could
// take 7 times its tokens per minute, every minute).
func TestK5ConcurrentStreamsRaceTheBudget(t *testing.T) {
	const n, chunks = 50, 2000
	streamBody := `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	huge := `{"model":"tiny","stream":true,"max_tokens":1000000000000,"messages":[{"role":"user","content":"hi"}]}`
	for _, row := range []struct {
		name      string
		lim       keystore.Limits
		body      string
		usage     int64 // per stream; 0 = the backend reports none
		wantAdmit int   // 0 = ceil(limit ÷ estimate)
	}{
		{"a day of 10,000 tokens, huge max_tokens: one stream at a time", keystore.Limits{TokensPerDay: 10000}, huge, 12000, 1},
		{"a day of 10,000 tokens, no max_tokens, usage reported", keystore.Limits{TokensPerDay: 10000}, streamBody, 2010, 0},
		{"a day of 10,000 tokens, no max_tokens, no usage", keystore.Limits{TokensPerDay: 10000}, streamBody, 0, 0},
		{"a minute of 10,000 tokens, no max_tokens, no usage", keystore.Limits{TokensPerMinute: 10000}, streamBody, 0, 0},
	} {
		t.Run(row.name, func(t *testing.T) {
			leakcheck.Check(t)
			st := keystore.New()
			sec, err := st.Create(keystore.Spec{Name: "k", Limits: row.lim}, fixedNow().Add(-time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			set, err := keys.Build(nil, st, true, 1)
			if err != nil {
				t.Fatal(err)
			}
			reg := keys.New(set)
			d := &gatedDispatcher{frames: func() []*iop.ProviderTunnelFrame { return sseStream(chunks, row.usage) },
				gate: make(chan struct{}), started: make(chan struct{}, n)}
			cfg := testConfig(nil)
			fp := newFakePool(protocol.TypeOpenAICompat)
			h := New(Options{Config: func() *config.Config { return cfg }, Pool: fp, Dispatcher: d, Now: fixedNow, NewID: seqIDs(), Keys: reg})
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			tr := &http.Transport{MaxIdleConnsPerHost: n}
			t.Cleanup(tr.CloseIdleConnections)
			t.Cleanup(d.kill)
			client := &http.Client{Transport: tr}

			limit := max(row.lim.TokensPerDay, row.lim.TokensPerMinute)
			est := keys.Estimate(len(row.body), 0)
			want := row.wantAdmit
			if want == 0 {
				want = int((limit + est - 1) / est)
			}
			type answer struct {
				status int
				body   string
				err    error
			}
			answers := make(chan answer, n)
			post := func() {
				req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(row.body))
				req.Header.Set("Authorization", "Bearer "+sec)
				resp, err := client.Do(req)
				if err != nil {
					answers <- answer{err: err}
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				answers <- answer{resp.StatusCode, string(b), err}
			}
			for range n {
				go post()
			}
			got := map[int]int{}
			deadline := time.NewTimer(waitFor)
			defer deadline.Stop()
			// The refused ones answer while the admitted ones are held.
			for started, refused := 0, 0; started < want || refused < n-want; {
				select {
				case <-d.started:
					started++
				case a := <-answers:
					if a.err != nil || a.status != http.StatusTooManyRequests {
						t.Fatalf("while %d streams are held: %d %s %v, want 429", started, a.status, a.body, a.err)
					}
					refused++
				case <-deadline.C:
					t.Fatalf("%d streams started (want %d), %d refused (want %d)", started, want, refused, n-want)
				}
			}
			close(d.gate)
			for range want {
				select {
				case a := <-answers:
					if a.err != nil || a.status != 200 || strings.Count(a.body, "\n\n") != chunks+1 {
						t.Fatalf("a stream: %d %v, %d events", a.status, a.err, strings.Count(a.body, "\n\n"))
					}
					got[a.status]++
				case <-deadline.C:
					t.Fatalf("%d of %d streams ended", got[200], want)
				}
			}
			select {
			case <-d.started:
				t.Fatal("more streams started than admitted")
			default:
			}
			ks, _ := reg.StatusOf("k", fixedNow())
			taken := int64(want) * int64(chunks) // the completion tokens the streams carried, at least
			charged := ks.PromptTokens + ks.CompletionTokens + ks.EstimatedTokens
			if charged < taken || ks.TokensToday != charged {
				t.Fatalf("%d streams carried %d tokens; the key was charged %d (today %d: prompt %d, completion %d, estimated %d)",
					want, taken, charged, ks.TokensToday, ks.PromptTokens, ks.CompletionTokens, ks.EstimatedTokens)
			}
			// The next request is refused until the window paid the
			// overrun back: for a minute's bucket, charged ÷ limit minutes.
			resp, body := func() (*http.Response, string) {
				req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(row.body))
				req.Header.Set("Authorization", "Bearer "+sec)
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp, string(b)
			}()
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("after the burst: %d %s, want 429", resp.StatusCode, body)
			}
			if row.lim.TokensPerMinute > 0 {
				wantWait := time.Duration((charged - limit) * int64(time.Minute) / limit)
				var after int
				fmt.Sscan(resp.Header.Get("Retry-After"), &after)
				if time.Duration(after)*time.Second < wantWait {
					t.Fatalf("Retry-After %ds, want at least %v: the overrun of %d tokens paid back", after, wantWait, charged-limit)
				}
			}
			t.Logf("%d of %d admitted, %d tokens carried, %d charged of a %d budget", want, n, taken, charged, limit)
		})
	}
}
