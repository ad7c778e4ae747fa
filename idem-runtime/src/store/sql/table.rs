//! The dedup table's name: the default, and the check that keeps anything
//! but a plain identifier out of the SQL text.

use crate::error::StoreError;

/// The dedup table every SQL store uses unless told otherwise.
pub(crate) const DEFAULT_TABLE: &str = "idem_keys";

/// Checks that `name` is a plain SQL identifier, optionally schema-qualified:
/// ASCII letters, digits and `_`, not starting with a digit, each part at most
/// 63 bytes. Nothing else ever reaches the SQL text.
pub(super) fn validate_table_name(name: &str) -> Result<(), StoreError> {
    let ok_part = |p: &str| {
        !p.is_empty()
            && p.len() <= 63
            && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !p.as_bytes()[0].is_ascii_digit()
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() <= 2 && parts.iter().all(|p| ok_part(p)) {
        Ok(())
    } else {
        Err(StoreError::InvalidTableName {
            name: name.to_owned(),
        })
    }
}

/// A table name without its schema.
pub(super) fn bare(table: &str) -> &str {
    table.rsplit('.').next().unwrap_or_default()
}

/// The name of an object of the table `bare` (an index, a partition, a
/// function): `<bare><suffix>`, or, where that would pass PostgreSQL's
/// 63-byte limit (and be cut to a name that may be the table's own, or
/// another long table's object), the table name's first 40 bytes (fewer
/// for a suffix longer than 14) and 8 hex digits of its SHA-256 before the
/// suffix. `bare` is validated (ASCII), so any byte is a char boundary;
/// `suffix` is this crate's, shorter than 54 bytes.
pub(super) fn derived_name(bare: &str, suffix: &str) -> String {
    if bare.len() + suffix.len() <= 63 {
        return format!("{bare}{suffix}");
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(bare.as_bytes());
    let hex = crate::key::hex(&digest[..4]);
    let keep = 40.min(63 - 9 - suffix.len());
    format!("{}_{hex}{suffix}", &bare[..keep])
}

#[cfg(test)]
mod tests {
    use super::validate_table_name;

    #[test]
    fn table_names() {
        for ok in ["idem_keys", "app.idem_keys", "_t1", "T"] {
            assert!(validate_table_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a.b.c",
            "a b",
            "keys;drop",
            "\"q\"",
            "é",
            ".a",
            &"x".repeat(64),
        ] {
            assert!(validate_table_name(bad).is_err(), "{bad}");
        }
    }
}
