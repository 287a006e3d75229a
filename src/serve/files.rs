//! Which server-side files a client may name: `CREATE EXTERNAL TABLE ... LOCATION` reads
//! them and `COPY ... TO` writes them, as the server's operating-system user. Over the
//! network that is the server's file system handed to every client, so paths are allowed
//! only under the directories the operator gives (`fragvec serve --allow-files DIR`), none
//! by default.
//!
//! The check is on the path, not on what DataFusion later opens: a location is made
//! absolute, refused if it climbs (`..`), and its longest existing ancestor is resolved
//! through symbolic links before the prefix test, so a link inside an allowed directory
//! that points outside it does not pass. Globs (`dir/*.parquet`) are checked by the
//! directory part before the first wildcard.

use std::path::{Component, Path, PathBuf};

use datafusion::sql::parser::Statement as DFStatement;

use crate::sql::FragvecStatement;

/// The directories clients may read and write files under (already resolved).
#[derive(Debug, Clone, Default)]
pub struct AllowedFiles {
    dirs: Vec<PathBuf>,
}

impl AllowedFiles {
    /// Nothing allowed.
    pub fn none() -> Self {
        Self::default()
    }

    /// The directories `dirs`, each of which must exist.
    pub fn new(dirs: &[PathBuf]) -> Result<Self, String> {
        let dirs = dirs
            .iter()
            .map(|d| {
                std::fs::canonicalize(d)
                    .map_err(|e| format!("--allow-files {}: {e}", d.display()))
                    .and_then(|c| {
                        if c.is_dir() {
                            Ok(c)
                        } else {
                            Err(format!("--allow-files {}: not a directory", d.display()))
                        }
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { dirs })
    }

    /// Whether `statement` names only allowed files; the refusal says which path and why.
    pub fn check(&self, statement: &FragvecStatement) -> Result<(), String> {
        let (verb, locations) = match statement {
            FragvecStatement::DataFusion(s) => match s.as_ref() {
                DFStatement::CreateExternalTable(c) => ("read", c.locations.as_slice()),
                DFStatement::CopyTo(c) => ("write", std::slice::from_ref(&c.target)),
                _ => return Ok(()),
            },
            _ => return Ok(()),
        };
        let cwd = std::env::current_dir().map_err(|e| e.to_string())?;
        for location in locations {
            self.check_location(location, &cwd).map_err(|why| {
                format!("this server does not let clients {verb} '{location}': {why}")
            })?;
        }
        Ok(())
    }

    fn check_location(&self, location: &str, cwd: &Path) -> Result<(), String> {
        if self.dirs.is_empty() {
            return Err("no directory is open to clients (start the server with \
                        --allow-files DIR)"
                .into());
        }
        let path = local_path(location)?;
        let resolved = resolve(&cwd.join(path))?;
        if self.dirs.iter().any(|d| resolved.starts_with(d)) {
            Ok(())
        } else {
            Err(format!(
                "it is outside the directories open to clients ({})",
                self.dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    }
}

/// The local path a location names (`file://` or a plain path); other schemes are refused.
fn local_path(location: &str) -> Result<&Path, String> {
    let path = match location.strip_prefix("file://") {
        Some(rest) => rest,
        None if location.contains("://") => {
            return Err("only local paths are open to clients, not other URLs".into());
        }
        None => location,
    };
    // A glob is checked by its directory part: what it can match lies below that.
    let cut = path.find(['*', '?', '[', '{']).unwrap_or(path.len());
    let fixed = &path[..cut];
    let fixed = if cut < path.len() {
        &fixed[..fixed.rfind('/').map_or(0, |i| i + 1)]
    } else {
        fixed
    };
    if fixed.is_empty() {
        return Ok(Path::new("."));
    }
    Ok(Path::new(fixed))
}

/// `path` (absolute) with its longest existing ancestor resolved through links and the rest
/// appended; refused if any part climbs.
fn resolve(path: &Path) -> Result<PathBuf, String> {
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err("a path may not contain '..'".into());
    }
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    loop {
        match std::fs::canonicalize(&existing) {
            Ok(real) => {
                let mut out = real;
                out.extend(rest.iter().rev());
                return Ok(out);
            }
            Err(_) => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_os_string());
                    existing = parent.to_path_buf();
                }
                _ => return Err("no part of the path exists".into()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(dir: &Path) -> AllowedFiles {
        AllowedFiles::new(&[dir.to_path_buf()]).unwrap()
    }

    #[test]
    fn nothing_is_open_by_default() {
        let err = AllowedFiles::none()
            .check_location("/tmp/x.parquet", Path::new("/"))
            .unwrap_err();
        assert!(err.contains("--allow-files"), "{err}");
    }

    #[test]
    fn paths_under_an_allowed_directory_pass_and_others_do_not() {
        let root = tempfile::tempdir().unwrap();
        let open = root.path().join("open");
        let closed = root.path().join("closed");
        std::fs::create_dir_all(open.join("sub")).unwrap();
        std::fs::create_dir_all(&closed).unwrap();
        let files = allowed(&open);
        let cwd = root.path();
        for ok in [
            "open/a.parquet",
            "open/sub/new/out.csv",
            "open/*.parquet",
            "open/sub/",
        ] {
            files
                .check_location(ok, cwd)
                .unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let absolute = format!("file://{}", open.join("x.parquet").display());
        files.check_location(&absolute, cwd).unwrap();
        for refused in [
            "closed/a.parquet",
            "open/../closed/a.parquet",
            "open2/a.parquet",
            "*.parquet",
            "/etc/passwd",
            "s3://bucket/x.parquet",
            "http://example.com/x.csv",
        ] {
            assert!(
                files.check_location(refused, cwd).is_err(),
                "{refused} passed"
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_link_out_of_an_allowed_directory_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let open = root.path().join("open");
        let closed = root.path().join("closed");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::create_dir_all(&closed).unwrap();
        std::os::unix::fs::symlink(&closed, open.join("link")).unwrap();
        let files = allowed(&open);
        let err = files
            .check_location("open/link/secret.csv", root.path())
            .unwrap_err();
        assert!(err.contains("outside"), "{err}");
    }

    #[test]
    fn an_allowed_directory_must_exist() {
        assert!(AllowedFiles::new(&[PathBuf::from("/no/such/dir/here")]).is_err());
    }
}
