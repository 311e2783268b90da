package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Bad flags exit 2 naming what is missing, before anything is built.
func TestRunFlags(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		epoch string
		want  string
	}{
		{"no epoch", []string{"-version", "1", "-commit", "c"}, "", "SOURCE_DATE_EPOCH"},
		{"bad epoch", []string{"-version", "1", "-commit", "c", "-epoch", "yesterday"}, "", "positive Unix seconds"},
		{"no version", []string{"-commit", "c"}, "1767225600", "-version and -commit are required"},
		{"no commit", []string{"-version", "1"}, "1767225600", "-version and -commit are required"},
		{"unknown flag", []string{"-versoin", "1"}, "1767225600", "flag provided but not defined"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(context.Background(), tc.args, tc.epoch, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
}

// A bad version is the library's error: exit 1, nothing written.
func TestRunBadVersion(t *testing.T) {
	var stderr bytes.Buffer
	out := t.TempDir()
	code := run(context.Background(), []string{"-version", "a/b", "-commit", "c", "-out", out, "-src", t.TempDir()}, "1767225600", &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "version must be") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}
