//! The JSON-lines event log: one line per verdict, and one per client reconnecting (its
//! resubscribe, with the versions it states), for users without a trace backend. Runs on the
//! sinks' thread; a write error is logged once and the log is given up, never the tap.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::correlate::Event;
use crate::queue::{Delivered, Sink};
use crate::record::ResubscribeRecord;

/// Appends one JSON object per verdict to a file.
pub struct EventLog {
    path: PathBuf,
    out: Option<BufWriter<File>>,
}

impl EventLog {
    /// Opens (creates, appends to) `path`.
    pub fn open(path: &Path) -> std::io::Result<EventLog> {
        // Owner only when the tap creates it, whatever the umask; an existing file keeps its mode.
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)?
        };
        Ok(EventLog {
            path: path.into(),
            out: Some(BufWriter::new(file)),
        })
    }
}

impl Sink for EventLog {
    fn on_event(&mut self, event: &Event) {
        self.deliver(&Delivered::new(event));
    }

    fn deliver(&mut self, delivered: &Delivered<'_>) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        let line = if let Some(verdict) = delivered.record() {
            serde_json::to_writer(&mut *out, verdict)
        } else if let Some(resubscribe) = ResubscribeRecord::from_event(delivered.event) {
            serde_json::to_writer(&mut *out, &resubscribe)
        } else {
            return;
        };
        let written = line
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        if let Err(e) = written {
            tracing::error!(path = %self.path.display(), "event log write failed, no more lines will be written: {e}");
            self.out = None;
        }
    }
}
