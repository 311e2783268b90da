package access

// HeaderRequestID is the request id header, on client requests and
// responses and on the Node's upstream requests.
const HeaderRequestID = "X-Request-Id"

// MaxRequestIDLen bounds a request id, bytes.
const MaxRequestIDLen = 128

// RequestID returns the id of a request whose X-Request-Id header is given
// (the first value; "" when absent): the client's id with every byte
// outside [A-Za-z0-9._:-] removed and cut to MaxRequestIDLen bytes, or —
// when nothing is left — a fresh one from mint. The result is safe in a log
// line, a header and a metric-free log key; it is never a metric label.
func RequestID(header string, mint func() string) string {
	if header != "" {
		if ok := validID(header); ok {
			return header
		}
		b := make([]byte, 0, min(len(header), MaxRequestIDLen))
		for i := 0; i < len(header) && len(b) < MaxRequestIDLen; i++ {
			if idByte(header[i]) {
				b = append(b, header[i])
			}
		}
		if len(b) > 0 {
			return string(b)
		}
	}
	return mint()
}

// validID reports whether s can be used as it is.
func validID(s string) bool {
	if len(s) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !idByte(s[i]) {
			return false
		}
	}
	return true
}

func idByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == ':' || c == '-'
}
