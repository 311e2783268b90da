package surface_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"iop/internal/edge/surface"
)

// F2: an image is taken as a data: URL of one of the API's image
// types whose bytes are an image of that type; anything else is a 400
// naming the field, never sent to Ollama (which drops an image it cannot
// decode and answers as if none was sent) and never fetched.
func TestDataURLImage(t *testing.T) {
	png := base64.StdEncoding.EncodeToString([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"))
	jpeg := base64.StdEncoding.EncodeToString([]byte("\xff\xd8\xff\xe0\x00\x10JFIF\x00"))
	gif := base64.StdEncoding.EncodeToString([]byte("GIF89a\x01\x00\x01\x00"))
	webp := base64.StdEncoding.EncodeToString([]byte("RIFF\x1a\x00\x00\x00WEBPVP8 "))
	rows := []struct{ name, url, want string }{
		{"png", "data:image/png;base64," + png, ""},
		{"jpeg", "data:image/jpeg;base64," + jpeg, ""},
		{"gif", "data:image/gif;base64," + gif, ""},
		{"webp", "data:image/webp;base64," + webp, ""},
		{"unpadded base64", "data:image/png;base64," + strings.TrimRight(png, "="), ""},
		{"remote URL", "https://169.254.169.254/latest/meta-data", "remote image URLs"},
		{"file URL", "file:///etc/passwd", "want a data: URL"},
		{"not base64", "data:image/png;base64,!!!", "not valid base64"},
		{"not base64-encoded", "data:image/png," + png, "want a base64 data: URL"},
		{"text type", "data:text/plain;base64,aGk=", "is not one of"},
		{"svg", "data:image/svg+xml;base64,PHN2Zy8+", "is not one of"},
		{"bytes that are no image", "data:image/png;base64,aGVsbG8=", "not of type image/png"},
		{"a jpeg called png", "data:image/png;base64," + jpeg, "look like image/jpeg"},
		{"empty data", "data:image/png;base64,", "not valid base64"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			img, e := surface.DataURLImage("image_url.url", row.url)
			switch {
			case row.want == "" && e != nil:
				t.Fatalf("got %v, want an image", e)
			case row.want == "" && len(img.Data) == 0:
				t.Fatal("got no image bytes")
			case row.want != "" && (e == nil || e.Status != 400 || !strings.Contains(e.Message, row.want)):
				t.Fatalf("got %v, want a 400 with %q", e, row.want)
			}
		})
	}
}
