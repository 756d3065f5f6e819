//! The tap's one clock and the one way it writes times: event timestamps and the views' ages
//! are Unix nanoseconds read here, and every time a report, record or line shows is written by
//! [`rfc3339`]. The core reads no clock: the observer passes it this one's readings.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::correlate::Timestamp;

/// Wall-clock now, Unix nanoseconds.
pub fn now() -> Timestamp {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Unix nanoseconds as `2026-11-29T13:28:13.123456Z`.
pub fn rfc3339(t: Timestamp) -> String {
    let secs = (t / 1_000_000_000) as i64;
    let micros = (t % 1_000_000_000) / 1_000;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_times() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        // 2026-11-29T13:28:13.5Z
        assert_eq!(
            rfc3339(1_795_958_893_500_000_000),
            "2026-11-29T13:28:13.500000Z"
        );
        // 2024-02-29T23:59:59Z, a leap day.
        assert_eq!(
            rfc3339(1_709_251_199_000_000_000),
            "2024-02-29T23:59:59.000000Z"
        );
    }
}
