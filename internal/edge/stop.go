package edge

import "time"

// StopOverhead bounds how long Serve goes on after ctx is done beyond the
// drain timeout (shutdown.drain_timeout_ms): the wait for the requests the
// drain timeout ended to answer, the server's Shutdown, the wait for
// handlers whose connections were closed and the wait for the cancelled
// streams' leases (drainHTTP, daemon.stop). A service manager's stop timeout must
// be above drain_timeout_ms + StopOverhead, or it kills a drain that was
// going to finish (deploy/systemd/iop-edge.service TimeoutStopSec).
const StopOverhead = 3*stopWait + time.Second
