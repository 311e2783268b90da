package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/leakcheck"
)

// TestRunExitCodes: S4-style exit codes — bad flags 2, listen failure 1.
func TestRunExitCodes(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"issue6 unknown flag", []string{"-nope"}, 2},
		{"issue6 stray argument", []string{"serve"}, 2},
		{"issue6 negative padding", []string{"-pad-bytes", "-1"}, 2},
		{"issue6 negative delay", []string{"-token-delay", "-5ms"}, 2},
		{"issue16 negative prefix cache", []string{"-prefix-cache", "-1"}, 2},
		{"issue16 negative prefill cost", []string{"-prefill-per-token", "-1ms"}, 2},
		{"issue6 bad listen address", []string{"-listen", "127.0.0.1:99999"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			if got := run(context.Background(), tt.args, &out); got != tt.want {
				t.Errorf("exit code: got %d, want %d (stderr %q)", got, tt.want, out.String())
			}
		})
	}
}

// TestRunServesAndStops: the startup line says stand-in, requests are logged
// as JSON start/end lines, and cancelling (SIGINT/SIGTERM in main) exits 0.
func TestRunServesAndStops(t *testing.T) {
	leakcheck.Check(t) // the server, the pipe drainer and run itself are gone afterwards
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"-listen", "127.0.0.1:0", "-token-delay", "1ms"}, pw)
		pw.Close()
	}()
	// The pipe is synchronous: one goroutine drains it so the server never
	// blocks on a log write; it ends when run returns and closes the pipe.
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func() map[string]any {
		var l string
		var ok bool
		select {
		case l, ok = <-lines:
		case <-time.After(5 * time.Second):
			t.Fatal("no log line within 5s")
		}
		if !ok {
			t.Fatal("stderr ended")
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", l, err)
		}
		return m
	}
	start := next()
	if msg, _ := start["msg"].(string); !strings.Contains(msg, "deterministic demo stand-in") {
		t.Fatalf("startup line: got %q, want it to say stand-in", msg)
	}
	addr, _ := start["addr"].(string)
	client := &http.Client{Transport: &http.Transport{}}
	resp, err := client.Post("http://"+addr+"/api/chat", "application/json",
		strings.NewReader(`{"model":"tiny","messages":[{"role":"user","content":"Hi"}]}`))
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	client.CloseIdleConnections()
	if !strings.Contains(string(body), `"done_reason":"stop"`) {
		t.Errorf("answer: got %s", body)
	}
	if m := next(); m["msg"] != "request start" || m["path"] != "/api/chat" {
		t.Errorf("got log %v, want request start", m)
	}
	if m := next(); m["msg"] != "request end" || m["outcome"] != "ok" || m["model"] != "tiny" {
		t.Errorf("got log %v, want request end ok", m)
	}
	cancel()
	select {
	case code := <-exited:
		if code != 0 {
			t.Errorf("exit code: got %d, want 0", code)
		}
		for range lines { // the shutdown lines, until the pipe closes
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return within 5s of cancel")
	}
}
