//! Protobuf's JSON mapping for the field types serde does not spell that way by itself:
//! `bytes` as base64, 64-bit integers as strings (numbers accepted), enums by name (numbers
//! accepted), `google.protobuf.Timestamp` as RFC 3339.

use base64::Engine;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serializer};

/// `bytes`: standard base64 out; standard or URL-safe, padded or not, in.
pub mod b64 {
    use super::*;

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = Option::<String>::deserialize(d)?.unwrap_or_default();
        decode(&s).map_err(D::Error::custom)
    }

    /// Decodes any of the base64 alphabets protobuf's JSON accepts.
    pub fn decode(s: &str) -> Result<Vec<u8>, Base64Error> {
        use base64::engine::general_purpose::{
            STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD,
        };
        let t = s.trim_end_matches('=');
        if t.contains(['-', '_']) {
            URL_SAFE_NO_PAD.decode(t)
        } else {
            STANDARD_NO_PAD.decode(t)
        }
        .or_else(|_| STANDARD.decode(s))
        .or_else(|_| URL_SAFE.decode(s))
        .map_err(Base64Error)
    }

    /// Text that is base64 in none of the alphabets protobuf's JSON accepts.
    #[derive(Debug, thiserror::Error)]
    #[error("invalid base64: {0}")]
    pub struct Base64Error(#[source] base64::DecodeError);
}

/// `int64`: a string out; a string or a number in.
pub mod i64s {
    use super::*;

    pub fn serialize<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum N {
            S(String),
            I(i64),
        }
        match Option::<N>::deserialize(d)? {
            None => Ok(0),
            Some(N::I(i)) => Ok(i),
            Some(N::S(s)) => s.parse().map_err(D::Error::custom),
        }
    }
}

/// An enum carried as an `i32` field: its name out; its name or its number in.
pub trait ProtoEnum: Sized + Copy {
    fn name(v: i32) -> Option<&'static str>;
    fn number(name: &str) -> Option<i32>;
}

pub fn enum_ser<E: ProtoEnum, S: Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
    match E::name(*v) {
        Some(n) => s.serialize_str(n),
        None => s.serialize_i32(*v),
    }
}

pub fn enum_de<'de, E: ProtoEnum, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        S(String),
        I(i32),
    }
    match Option::<V>::deserialize(d)? {
        None => Ok(0),
        Some(V::I(i)) => Ok(i),
        Some(V::S(s)) => {
            E::number(&s).ok_or_else(|| D::Error::custom(format!("unknown enum value {s:?}")))
        }
    }
}

/// `google.protobuf.Timestamp` as RFC 3339 (`1970-01-01T00:00:00Z`, nanoseconds when not 0).
pub mod timestamp {
    use super::super::Timestamp;
    use super::*;

    pub fn serialize<S: Serializer>(v: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            None => s.serialize_none(),
            Some(t) => s.serialize_str(&rfc3339(t)),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) => parse(&s)
                .map(Some)
                .ok_or_else(|| D::Error::custom("invalid timestamp")),
        }
    }

    pub fn rfc3339(t: &Timestamp) -> String {
        let days = t.seconds.div_euclid(86_400);
        let secs = t.seconds.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        let base = format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        );
        if t.nanos == 0 {
            format!("{base}Z")
        } else {
            format!("{base}.{:09}Z", t.nanos)
        }
    }

    /// Parses the `Z` form this module writes (what a client echoes back).
    pub fn parse(s: &str) -> Option<Timestamp> {
        let s = s.strip_suffix('Z')?;
        let (date, time) = s.split_once('T')?;
        let mut dp = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
        let (y, m, d) = (dp.next()??, dp.next()??, dp.next()??);
        let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
        let mut tp = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
        let (hh, mm, ss) = (tp.next()??, tp.next()??, tp.next()??);
        if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
            return None;
        }
        let nanos = if frac.is_empty() {
            0
        } else if frac.len() <= 9 && frac.bytes().all(|b| b.is_ascii_digit()) {
            format!("{frac:0<9}").parse().ok()?
        } else {
            return None;
        };
        Some(Timestamp {
            seconds: days_from_civil(y, m, d) * 86_400 + hh * 3600 + mm * 60 + ss,
            nanos,
        })
    }

    // Howard Hinnant's algorithms for the proleptic Gregorian calendar.
    fn civil_from_days(z: i64) -> (i64, i64, i64) {
        let z = z + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        (y, m, d)
    }

    fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y.rem_euclid(400);
        let mp = if m > 2 { m - 3 } else { m + 9 };
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }
}

#[cfg(test)]
mod tests {
    use super::super::Timestamp;
    use super::*;

    #[test]
    fn timestamps_round_trip() {
        for (secs, nanos, s) in [
            (0, 0, "1970-01-01T00:00:00Z"),
            (951_782_400, 0, "2000-02-29T00:00:00Z"),
            (1_733_333_333, 5_000_000, "2024-12-04T17:28:53.005000000Z"),
            (-1, 0, "1969-12-31T23:59:59Z"),
        ] {
            let t = Timestamp {
                seconds: secs,
                nanos,
            };
            assert_eq!(timestamp::rfc3339(&t), s);
            assert_eq!(timestamp::parse(s), Some(t));
        }
        assert_eq!(timestamp::parse("2024-13-01T00:00:00Z"), None);
        assert_eq!(timestamp::parse("garbage"), None);
    }

    #[test]
    fn base64_accepts_every_alphabet() {
        assert_eq!(b64::decode("aGk=").unwrap(), b"hi");
        assert_eq!(b64::decode("aGk").unwrap(), b"hi");
        assert_eq!(b64::decode("-_8").unwrap(), vec![0xfb, 0xff]);
        assert_eq!(b64::decode("+/8=").unwrap(), vec![0xfb, 0xff]);
        assert!(b64::decode("!!").is_err());
    }
}
