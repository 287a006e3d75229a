//! How table and view names map to folder names in a database, and back: the arithmetic,
//! no IO. Any name a user can write is stored; plain names as themselves, others encoded so
//! that no two names, and no name and the database's own folders, share a folder.

use super::error::{FormatError, Result};

/// Checks that `name` can name a table or view: 1 to 128 bytes, no control characters, and
/// none of `@` and `#` (relation names use them for versions and virtual columns) or `/`.
/// Any other name is stored (see [`folder_name`]): `foo.bar`, `_t`, `my table` included.
pub fn validate_table_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name
            .chars()
            .any(|c| c.is_control() || matches!(c, '@' | '#' | '/'));
    if ok {
        Ok(())
    } else {
        Err(FormatError::invalid(format!(
            "invalid table name '{name}': use 1 to 128 bytes without '@', '#', '/' or control characters"
        )))
    }
}

/// Whether a name is stored as itself: letters, digits, `_` and `-`, not starting with `_`
/// (names starting with `_` are the database's own: `_views`, probes).
fn is_plain_name(name: &str) -> bool {
    name.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !name.starts_with('_')
}

/// The folder (or file stem) that stores table or view `name`: the name itself when it is
/// plain, else `=` and the hex of its UTF-8 bytes (so names with `.`, spaces or a leading `_`
/// cannot collide with plain names, the database's own folders, or each other).
pub fn folder_name(name: &str) -> Result<String> {
    validate_table_name(name)?;
    if is_plain_name(name) {
        return Ok(name.to_string());
    }
    Ok(std::iter::once("=".to_string())
        .chain(name.bytes().map(|b| format!("{b:02x}")))
        .collect())
}

/// The table or view name a folder stores, if it stores one (see [`folder_name`]).
pub fn name_of_folder(folder: &str) -> Option<String> {
    let name = match folder.strip_prefix('=') {
        Some(hex) => {
            if hex.len() % 2 != 0 {
                return None;
            }
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                .collect::<Option<Vec<u8>>>()?;
            let name = String::from_utf8(bytes).ok()?;
            if is_plain_name(&name) {
                return None; // not how folder_name stores it
            }
            name
        }
        None if is_plain_name(folder) => folder.to_string(),
        None => return None,
    };
    validate_table_name(&name).ok().map(|_| name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_names_are_their_folders_and_others_are_encoded() {
        assert_eq!(folder_name("items").unwrap(), "items");
        assert_eq!(folder_name("my-t_2").unwrap(), "my-t_2");
        assert_eq!(folder_name("_views").unwrap(), "=5f7669657773");
        assert_eq!(folder_name("a.b").unwrap(), "=612e62");
        for bad in ["", "a@1", "a#b", "a/b", "tab\tle", &"x".repeat(129)] {
            assert!(folder_name(bad).is_err(), "{bad:?}");
        }
        // Folders no name maps to: the database's own, odd or plain-looking hex, bad UTF-8.
        for folder in ["_views", "=61", "=6", "=zz", "=ff", ""] {
            assert_eq!(name_of_folder(folder), None, "{folder:?}");
        }
    }

    proptest! {
        #[test]
        fn every_valid_name_round_trips_through_its_own_folder(
            a in "\\PC{1,12}",
            b in "[a-z_.=-]{1,6}",
        ) {
            for name in [&a, &b] {
                if validate_table_name(name).is_ok() {
                    let folder = folder_name(name).unwrap();
                    prop_assert_eq!(name_of_folder(&folder), Some(name.clone()));
                    prop_assert!(!folder.starts_with('_'));
                }
            }
            if a != b && validate_table_name(&a).is_ok() && validate_table_name(&b).is_ok() {
                prop_assert_ne!(folder_name(&a).unwrap(), folder_name(&b).unwrap());
            }
        }
    }
}
