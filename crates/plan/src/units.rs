//! Parse the counts and sizes users type: `7B` parameters, `80GiB` or `80GB` of memory.
//!
//! Binary suffixes (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones (K, M, B/G, T for
//! counts; KB, MB, GB, TB for bytes) are powers of 1000, as GPU memory tables write GB = 10^9 bytes.
//! Example: `parse_count("7B")` is 7,000,000,000; `parse_bytes("80GiB")` is 80 × 2^30.

use crate::PlanError;

fn split_number(text: &str) -> Option<(f64, &str)> {
    let t = text.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let number: String = t[..end].chars().filter(|&c| c != '_').collect();
    let value: f64 = number.parse().ok()?;
    Some((value, t[end..].trim()))
}

fn scaled(value: f64, scale: f64, field: &str, text: &str) -> Result<u64, PlanError> {
    let x = value * scale;
    if !x.is_finite() || x < 0.0 || x > u64::MAX as f64 {
        return Err(PlanError::Invalid {
            field: field.into(),
            reason: format!("'{text}' is out of range"),
        });
    }
    Ok(x.round() as u64)
}

/// A count such as `7B`, `1.5B`, `124M`, `350K` or `7000000000` (`field` names the flag).
pub fn parse_count(text: &str, field: &str) -> Result<u64, PlanError> {
    let bad = || PlanError::Invalid {
        field: field.into(),
        reason: format!("'{text}' is not a count: write e.g. 7B, 1.5B, 124M or 7000000000"),
    };
    if text.trim().starts_with('-') {
        return Err(PlanError::Invalid {
            field: field.into(),
            reason: format!("'{text}' is negative: a count is 0 or more"),
        });
    }
    let (value, suffix) = split_number(text).ok_or_else(bad)?;
    let scale = match suffix.to_ascii_uppercase().as_str() {
        "" => 1.0,
        "K" => 1e3,
        "M" => 1e6,
        "B" | "G" => 1e9,
        "T" => 1e12,
        _ => return Err(bad()),
    };
    let x = value * scale;
    if (x - x.round()).abs() > 1e-9 * x.max(1.0) {
        return Err(PlanError::Invalid {
            field: field.into(),
            reason: format!("'{text}' is not a whole number of items: write e.g. 1.5B or 124M"),
        });
    }
    scaled(value, scale, field, text)
}

/// A size in bytes such as `80GiB`, `80GB`, `512MiB` or `1024` (`field` names the flag).
pub fn parse_bytes(text: &str, field: &str) -> Result<u64, PlanError> {
    let bad = || PlanError::Invalid {
        field: field.into(),
        reason: format!("'{text}' is not a size: write e.g. 80GiB (2^30 bytes) or 80GB (10^9)"),
    };
    let (value, suffix) = split_number(text).ok_or_else(bad)?;
    let scale = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        _ => return Err(bad()),
    };
    scaled(value, scale, field, text)
}

/// Bytes in the largest binary unit that keeps the number at or above 1: B, KiB, MiB, GiB, TiB,
/// PiB, EiB. Example: `human_bytes(1536 * 1024 * 1024)` is `"1.50 GiB"`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// `8030261248` as `8,030,261,248`.
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_sizes() {
        assert_eq!(parse_count("7B", "params").unwrap(), 7_000_000_000);
        assert_eq!(parse_count("1.5b", "params").unwrap(), 1_500_000_000);
        assert_eq!(parse_count("124M", "params").unwrap(), 124_000_000);
        assert_eq!(parse_bytes("80GiB", "m").unwrap(), 80 << 30);
        assert_eq!(parse_bytes("80GB", "m").unwrap(), 80_000_000_000);
        assert!(parse_count("seven", "params").is_err());
        assert!(parse_bytes("80 parsecs", "m").is_err());
    }
}
