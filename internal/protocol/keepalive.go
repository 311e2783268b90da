package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// MaxKeepAliveLen bounds an adapter's keep_alive, bytes.
const MaxKeepAliveLen = 32

// ErrBadKeepAlive: an ollama adapter's keep_alive is neither a duration
// nor whole seconds.
var ErrBadKeepAlive = errors.New("bad keep_alive")

// KeepAliveSeconds checks an ollama adapter's keep_alive (SPEC U7; Ollama
// 0.17.4's api.Duration): a Go duration ("10m", "24h", "-1m"; negative =
// keep loaded, "0" = unload after the request), which Ollama takes as a
// JSON string, or a whole number of seconds ("3600", "-1"), which it
// takes as a JSON number — Ollama refuses a string without a unit such as
// "300". It reports whether s is seconds. Errors wrap ErrBadKeepAlive.
func KeepAliveSeconds(s string) (seconds bool, err error) {
	if len(s) > MaxKeepAliveLen {
		return false, fmt.Errorf("%w: %.32q… is longer than %d bytes", ErrBadKeepAlive, s, MaxKeepAliveLen)
	}
	if _, err := strconv.ParseInt(s, 10, 64); err == nil {
		return true, nil
	}
	if _, err := time.ParseDuration(s); err != nil {
		return false, fmt.Errorf("%w: %q is neither a duration (\"10m\", \"-1m\", \"0\") nor whole seconds (\"3600\", \"-1\")", ErrBadKeepAlive, s)
	}
	return false, nil
}
