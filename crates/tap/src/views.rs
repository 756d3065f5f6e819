//! The views: what the tap keeps to be asked. The status board (per node and type, what it
//! runs and how it stands), the rollout view (per type and version, who took it) and the
//! watchers (live verdicts); each is a sink on the sinks' thread, read by the admin server. And
//! the trace each verdict's span is in, which they link to.

pub mod board;
pub mod rollout;
pub mod traces;
pub mod watch;
