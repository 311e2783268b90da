package admin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/batch"
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

type fakeBatches []batch.KeyBatches

func (f fakeBatches) InProgress() []batch.KeyBatches { return f }

// X6: /status lists the batches in progress per key; the page has their
// table.
func TestStatusBatches(t *testing.T) {
	bs := fakeBatches{{Principal: "team-a", Batches: 2, Lines: 30, Completed: 7, InFlight: 4, Oldest: "batch_x", Status: batch.InProgress}}
	srv := httptest.NewServer(New(Options{Status: status(), Batches: bs}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Batches []batch.KeyBatches `json:"batches"`
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || len(st.Batches) != 1 || st.Batches[0] != bs[0] {
		t.Fatalf("/status batches: %v %+v", err, st.Batches)
	}
	resp, err = http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), `<table id="batches">`) || !strings.Contains(string(page), `fill("batches", st.batches`) {
		t.Fatal("the operator page has no batches table")
	}
}
