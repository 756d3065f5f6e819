//! The integration tests, one binary so that the harness in `support` and the library's test
//! build are compiled and linked once. Each module's own `//!` says what it checks, against
//! which real peers; `docs/testing.md` says how to run them. `tests/rollout_memory.rs` stays a
//! binary of its own: its counting allocator must see nothing else.

use xdstap_support as support;

mod alerts;
mod bad_input;
mod big_push;
mod cli;
mod correlation;
mod crossing;
mod csds;
mod decode;
mod docs;
mod envoy_forward;
mod failover;
mod faults;
mod fleet;
mod late_answers;
mod layout;
mod load;
mod objects;
mod outage;
mod page;
mod partial;
mod peer_errors;
mod proxyless;
mod queue;
mod recipes;
mod reconnect;
mod restarts;
mod roll;
mod rollouts;
mod slow_observer;
mod spans;
mod status;
mod tls_errors;
mod tls_unix;
mod transparency;
mod wait_object;
mod warming;
mod wire;
