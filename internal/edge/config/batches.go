package config

// Batch defaults and bounds (docs/config.md "Batches", SPEC X1-X6).
const (
	// DefaultBatchMaxInFlight is batches.max_in_flight: lines of one batch
	// in flight at once.
	DefaultBatchMaxInFlight = 8
	MaxBatchMaxInFlight     = 1024
	// DefaultBatchMaxFileBytes is batches.max_file_bytes: one uploaded
	// file, 100 MiB (OpenAI's bound on a batch input file).
	DefaultBatchMaxFileBytes = 100 << 20
	MaxBatchMaxFileBytes     = 1 << 40
	// DefaultBatchMaxLines is batches.max_lines: lines of one input file
	// (OpenAI's bound: 50,000 requests).
	DefaultBatchMaxLines = 50000
	MaxBatchMaxLines     = 10_000_000
	// DefaultBatchMaxStorageBytes is batches.max_storage_bytes: every
	// file and journal under batches.dir together, 10 GiB.
	DefaultBatchMaxStorageBytes = 10 << 30
	// DefaultBatchMaxPerKey is batches.max_batches_per_key: the batches of
	// one key that have not ended (SPEC X4: each holds a driver and up to
	// max_in_flight lines, so one key cannot take the edge with many).
	DefaultBatchMaxPerKey = 16
	MaxBatchMaxPerKey     = 10000
	// DefaultBatchMaxStorageBytesPerKey is batches.max_storage_bytes_per_key
	// (when batches.max_file_bytes is not larger): a key's files, 1 GiB.
	DefaultBatchMaxStorageBytesPerKey = 1 << 30
	// DefaultBatchMaxFilesPerKey is batches.max_files_per_key: the files
	// of one key (uploads and outputs) however small, which the byte
	// bounds do not see (each takes a disk block, an inode, a read at
	// start); OpenAI's file list pages at 10,000.
	DefaultBatchMaxFilesPerKey = 10000
	MaxBatchMaxFilesPerKey     = 10_000_000
)

// Batches configures the OpenAI Batch and Files API the edge runs itself
// (/v1/files, /v1/batches; SPEC X1-X6). It is on when Dir is set. Read at
// start: a reload that changes it is logged and takes effect after a
// restart.
type Batches struct {
	// Dir holds the uploaded files, the batches and their journals; one
	// edge at a time (it holds a lock on it). Relative to the config
	// file's directory. "" = the Batch and Files API is off (404).
	Dir string `json:"dir"`
	// MaxInFlight bounds the lines of one batch in flight at once; 0 = 8,
	// 1 to 1024.
	MaxInFlight int `json:"max_in_flight"`
	// MaxFileBytes bounds one uploaded file, bytes; 0 = 100 MiB.
	MaxFileBytes int64 `json:"max_file_bytes"`
	// MaxLines bounds the lines of one uploaded file; 0 = 50,000.
	MaxLines int `json:"max_lines"`
	// MaxStorageBytes bounds everything under Dir (files, outputs,
	// journals); an upload that would pass it is refused; 0 = 10 GiB.
	MaxStorageBytes int64 `json:"max_storage_bytes"`
	// MaxPerKey bounds the batches of one key that have not ended; one
	// more is refused (429); 0 = 16, 1 to 10,000.
	MaxPerKey int `json:"max_batches_per_key"`
	// MaxStorageBytesPerKey bounds the files of one key (its uploads and
	// its batches' outputs) so that one key cannot fill Dir for every
	// other; an upload that would pass it is refused; 0 = 1 GiB or
	// MaxFileBytes if larger, at most MaxStorageBytes.
	MaxStorageBytesPerKey int64 `json:"max_storage_bytes_per_key"`
	// MaxFilesPerKey bounds the number of files of one key (its uploads
	// and its batches' outputs); an upload past it is refused (507);
	// 0 = 10,000, 1 to 10,000,000.
	MaxFilesPerKey int `json:"max_files_per_key"`
}

// Enabled reports whether the Batch and Files API is served.
func (b Batches) Enabled() bool { return b.Dir != "" }

func (c *Config) batchesDefaults() {
	b := &c.Batches
	if b.MaxInFlight == 0 {
		b.MaxInFlight = DefaultBatchMaxInFlight
	}
	if b.MaxFileBytes == 0 {
		b.MaxFileBytes = DefaultBatchMaxFileBytes
	}
	if b.MaxLines == 0 {
		b.MaxLines = DefaultBatchMaxLines
	}
	if b.MaxStorageBytes == 0 {
		b.MaxStorageBytes = DefaultBatchMaxStorageBytes
	}
	if b.MaxPerKey == 0 {
		b.MaxPerKey = DefaultBatchMaxPerKey
	}
	if b.MaxFilesPerKey == 0 {
		b.MaxFilesPerKey = DefaultBatchMaxFilesPerKey
	}
	if b.MaxStorageBytesPerKey == 0 {
		b.MaxStorageBytesPerKey = min(max(DefaultBatchMaxStorageBytesPerKey, b.MaxFileBytes), b.MaxStorageBytes)
	}
}

// validateBatches checks the batches block.
func (c *Config) validateBatches(add func(string, string, ...any)) {
	b := c.Batches
	if b.MaxInFlight < 1 || b.MaxInFlight > MaxBatchMaxInFlight {
		add("batches.max_in_flight", "must be between 1 and %d, got %d", MaxBatchMaxInFlight, b.MaxInFlight)
	}
	if b.MaxFileBytes < 1 || b.MaxFileBytes > MaxBatchMaxFileBytes {
		add("batches.max_file_bytes", "must be between 1 and %d, got %d", int64(MaxBatchMaxFileBytes), b.MaxFileBytes)
	}
	if b.MaxLines < 1 || b.MaxLines > MaxBatchMaxLines {
		add("batches.max_lines", "must be between 1 and %d, got %d", MaxBatchMaxLines, b.MaxLines)
	}
	if b.MaxPerKey < 1 || b.MaxPerKey > MaxBatchMaxPerKey {
		add("batches.max_batches_per_key", "must be between 1 and %d, got %d", MaxBatchMaxPerKey, b.MaxPerKey)
	}
	if b.MaxStorageBytesPerKey < b.MaxFileBytes || b.MaxStorageBytesPerKey > b.MaxStorageBytes {
		add("batches.max_storage_bytes_per_key", "must be between batches.max_file_bytes (%d) and batches.max_storage_bytes (%d), got %d", b.MaxFileBytes, b.MaxStorageBytes, b.MaxStorageBytesPerKey)
	}
	if b.MaxFilesPerKey < 1 || b.MaxFilesPerKey > MaxBatchMaxFilesPerKey {
		add("batches.max_files_per_key", "must be between 1 and %d, got %d", MaxBatchMaxFilesPerKey, b.MaxFilesPerKey)
	}
	if b.MaxStorageBytes < b.MaxFileBytes {
		add("batches.max_storage_bytes", "must be at least batches.max_file_bytes (%d), got %d", b.MaxFileBytes, b.MaxStorageBytes)
	}
}
