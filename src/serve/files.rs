//! Which server-side files a client may name: `CREATE EXTERNAL TABLE ... LOCATION` reads
//! them and `COPY ... TO` writes them, as the server's operating-system user. Over the
//! network that is the server's file system handed to every client, so paths are allowed
//! only under the directories the operator gives (`fragvec serve --allow-files DIR`), none
//! by default.
//!
//! The check is on the path and, for a directory, on what DataFusion will list in it: a
//! location is made absolute, refused if it climbs (`..`), and its longest existing ancestor
//! is resolved through symbolic links before the prefix test, so a link inside an allowed
//! directory that points outside it does not pass. Globs (`dir/*.parquet`) are checked by
//! the directory part before the first wildcard. A directory (or a glob's) is walked, and
//! a link anywhere in it that leads outside refuses the whole location, since the reader
//! follows links when it lists. (A link made between the check and the read is not seen:
//! the open directories are the operator's, and clients cannot make links.)

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
        if !self.inside(&resolved) {
            return Err(self.outside());
        }
        // A directory (or a glob's directory) is listed by the reader, which follows the
        // links in it: each of them must stay inside too.
        if resolved.is_dir() {
            self.links_stay_inside(&resolved)?;
        }
        Ok(())
    }

    fn inside(&self, resolved: &Path) -> bool {
        self.dirs.iter().any(|d| resolved.starts_with(d))
    }

    fn outside(&self) -> String {
        format!(
            "it is outside the directories open to clients ({})",
            self.dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// Every entry below `dir` (a resolved directory) resolves inside the open
    /// directories. Bounded: a tree of more than [`MAX_LISTED`] entries is refused.
    fn links_stay_inside(&self, dir: &Path) -> Result<(), String> {
        let mut pending = vec![dir.to_path_buf()];
        let mut seen = 0usize;
        while let Some(d) = pending.pop() {
            let entries = std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            for entry in entries {
                let entry = entry.map_err(|e| format!("{}: {e}", d.display()))?;
                seen += 1;
                if seen > MAX_LISTED {
                    return Err(format!(
                        "it holds more than {MAX_LISTED} entries; name the files"
                    ));
                }
                let kind = entry.file_type().map_err(|e| e.to_string())?;
                if kind.is_symlink() {
                    // A dangling link reads nothing; any other must land inside.
                    if let Ok(target) = std::fs::canonicalize(entry.path())
                        && !self.inside(&target)
                    {
                        return Err(format!(
                            "{} links to {}: {}",
                            entry.path().display(),
                            target.display(),
                            self.outside()
                        ));
                    }
                } else if kind.is_dir() {
                    pending.push(entry.path());
                }
            }
        }
        Ok(())
    }
}

/// Entries a directory location may hold for the link check.
const MAX_LISTED: usize = 100_000;

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

    #[cfg(unix)]
    #[test]
    fn a_directory_or_glob_holding_a_link_out_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let open = root.path().join("open");
        let closed = root.path().join("closed");
        std::fs::create_dir_all(open.join("sub")).unwrap();
        std::fs::create_dir_all(&closed).unwrap();
        std::fs::write(closed.join("secret.parquet"), b"x").unwrap();
        std::fs::write(open.join("ok.parquet"), b"x").unwrap();
        let files = allowed(&open);
        let cwd = root.path();
        files.check_location("open", cwd).unwrap();
        // A link inside, to a file inside, is fine.
        std::os::unix::fs::symlink(open.join("ok.parquet"), open.join("sub/alias.parquet"))
            .unwrap();
        files.check_location("open/", cwd).unwrap();
        std::os::unix::fs::symlink(closed.join("secret.parquet"), open.join("sub/link.parquet"))
            .unwrap();
        for location in ["open", "open/", "open/sub/*.parquet", "./open/sub"] {
            let err = files.check_location(location, cwd).unwrap_err();
            assert!(err.contains("links to"), "{location}: {err}");
        }
        // A file location next to the link is still fine.
        files.check_location("open/ok.parquet", cwd).unwrap();
    }

    #[test]
    fn an_allowed_directory_must_exist() {
        assert!(AllowedFiles::new(&[PathBuf::from("/no/such/dir/here")]).is_err());
    }
}
