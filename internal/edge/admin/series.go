package admin

import "net/http"

// SeriesSource gives the operator page's recent history as JSON
// (access.Series: the last 15 minutes per model group and provider).
type SeriesSource interface {
	JSON() []byte
}

// serveSeries writes GET /series: the shape access.Series.AppendJSON
// documents, or 404 when the edge keeps no series.
func serveSeries(w http.ResponseWriter, src SeriesSource) {
	if src == nil {
		http.Error(w, "series unavailable", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(src.JSON())
}
