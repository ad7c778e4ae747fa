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
