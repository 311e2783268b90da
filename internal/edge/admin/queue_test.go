package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"iop/internal/edge/pool"
)

type fakeWaiting struct{}

func (fakeWaiting) Waiting() (map[string]int, [pool.NumPriorities]int) {
	return map[string]int{"team-a": 3, "": 1}, [pool.NumPriorities]int{0, 1, 3}
}

// TestStatusQueue: /status says who waits, per key (_open for open mode)
// and per priority class (SPEC G6).
func TestStatusQueue(t *testing.T) {
	srv := httptest.NewServer(New(Options{Status: status(), Waiting: fakeWaiting{}}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var st struct {
		Queue struct {
			ByKey   map[string]int `json:"waiting_by_key"`
			ByClass map[string]int `json:"waiting_by_class"`
		} `json:"queue"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("status is not JSON: %v: %s", err, b)
	}
	q := st.Queue
	if q.ByKey["team-a"] != 3 || q.ByKey["_open"] != 1 || len(q.ByKey) != 2 ||
		q.ByClass["critical"] != 0 || q.ByClass["interactive"] != 1 || q.ByClass["batch"] != 3 {
		t.Fatalf("G6 queue %+v: %s", q, b)
	}
}
