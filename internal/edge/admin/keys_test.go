package admin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"iop/internal/edge/keys"
)

type fakeKeys []keys.KeyStatus

func (f fakeKeys) Status(time.Time) []keys.KeyStatus { return append([]keys.KeyStatus(nil), f...) }

// K7: /status lists the keys with the most tokens today first, at most
// StatusKeys of them with the total; /status/keys lists every one.
func TestStatusKeys(t *testing.T) {
	var ks fakeKeys
	for i := range StatusKeys + 20 {
		ks = append(ks, keys.KeyStatus{Name: fmt.Sprintf("k%03d", i), Status: "active", TokensToday: int64(i % 7), Requests: int64(i)})
	}
	srv := httptest.NewServer(New(Options{Status: status(), Keys: ks}))
	defer srv.Close()
	get := func(path string, v any) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v: %s", path, err, b)
		}
	}
	var st struct {
		Total int              `json:"keys_total"`
		Keys  []keys.KeyStatus `json:"keys"`
	}
	get("/status", &st)
	if st.Total != StatusKeys+20 || len(st.Keys) != StatusKeys {
		t.Fatalf("keys_total %d, %d listed; want %d, %d", st.Total, len(st.Keys), StatusKeys+20, StatusKeys)
	}
	for i := 1; i < len(st.Keys); i++ {
		a, b := st.Keys[i-1], st.Keys[i]
		if a.TokensToday < b.TokensToday || a.TokensToday == b.TokensToday && a.Requests < b.Requests {
			t.Fatalf("not by tokens today, then requests: %+v before %+v", a, b)
		}
	}
	var all struct {
		Keys []keys.KeyStatus `json:"keys"`
	}
	get("/status/keys", &all)
	if len(all.Keys) != StatusKeys+20 || all.Keys[0].Name != "k000" {
		t.Fatalf("/status/keys: %d keys, first %+v", len(all.Keys), all.Keys[0])
	}
}
