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

/// `2026-12-04T10:00:00Z` (with or without a fraction of a second, `Z` or an offset) as Unix
/// nanoseconds; none for anything else.
pub fn parse_rfc3339(s: &str) -> Option<Timestamp> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut nanos: i64 = 0;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let digits = s.get(start..i)?;
        if digits.is_empty() {
            return None;
        }
        let mut d = digits.chars().take(9).collect::<String>();
        while d.len() < 9 {
            d.push('0');
        }
        nanos = d.parse().ok()?;
    }
    let offset = match s.get(i..)? {
        "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) && &o[3..4] == ":" => {
            let sign = if o.starts_with('-') { -1 } else { 1 };
            sign * (num(i + 1..i + 3)? * 3600 + num(i + 4..i + 6)? * 60)
        }
        _ => return None,
    };
    // Days since 1970-01-01 from the civil date (the inverse of rfc3339's).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
    u64::try_from(secs)
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(nanos as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_times_back() {
        for t in [
            0,
            1_795_958_893_500_000_000,
            1_709_251_199_000_000_000,
            1_795_958_893_123_456_000,
        ] {
            assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
        }
        assert_eq!(
            parse_rfc3339("2026-11-29T14:28:13+01:00"),
            Some(1_795_958_893_000_000_000)
        );
        for bad in [
            "",
            "yesterday",
            "2026-11-29",
            "2026-13-29T00:00:00Z",
            "2026-11-29T00:00:00",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

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
