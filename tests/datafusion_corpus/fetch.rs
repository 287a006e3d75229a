//! Where the corpus comes from: the `datafusion-sqllogictest` 55.2.0 crate's `test_files/`.
//!
//! The crate is not a dependency (its features would unify with fragvec's and rebuild
//! DataFusion), so its files are fetched when the test runs: the `.crate` archive from cargo's
//! own cache (`$CARGO_HOME/registry/cache/*/`), else downloaded from crates.io with `curl`,
//! checked against a pinned SHA-256, and unpacked with `tar` into a cache directory under the
//! target directory. An unpacked copy in `$CARGO_HOME/registry/src/*/` is copied instead
//! when there is one. Without any of these (offline, no curl), the caller skips the corpus.

use std::path::{Path, PathBuf};
use std::process::Command;

pub const CRATE_NAME: &str = "datafusion-sqllogictest";
pub const CRATE_VERSION: &str = "55.2.0";
/// SHA-256 of `datafusion-sqllogictest-55.2.0.crate` as published on crates.io.
const CRATE_SHA256: &str = "b270cea4d8c2b2c42773e60164204386fb97d7936736e5f126ac751b86d7dabe";
const CRATE_URL: &str = "https://static.crates.io/crates/datafusion-sqllogictest/55.2.0/download";

/// The crate's directory, laid out as in DataFusion's repository (`<root>/datafusion/
/// sqllogictest`), so the relative paths the files use (`../../testing/data/...`, missing
/// here) and the `WORKSPACE_ROOT` their expected EXPLAIN output names resolve as there.
pub fn crate_dir(cache: &Path) -> Result<PathBuf, String> {
    let dir = cache.join("datafusion").join("sqllogictest");
    let stamp = dir.join(".fragvec-complete");
    if stamp.exists() {
        return Ok(dir);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(cache).map_err(|e| format!("creating {}: {e}", cache.display()))?;
    let unpacked = cache.join(format!("{CRATE_NAME}-{CRATE_VERSION}"));
    if unpacked.exists() {
        std::fs::remove_dir_all(&unpacked)
            .map_err(|e| format!("removing {}: {e}", unpacked.display()))?;
    }
    if let Some(src) = registry_paths("src")
        .into_iter()
        .map(|p| p.join(format!("{CRATE_NAME}-{CRATE_VERSION}")))
        .find(|p| p.join("test_files").is_dir())
    {
        run(Command::new("cp").arg("-R").arg(&src).arg(&unpacked))?;
    } else {
        let archive = archive(cache)?;
        run(Command::new("tar")
            .arg("xzf")
            .arg(&archive)
            .arg("-C")
            .arg(cache))?;
    }
    if !unpacked.join("test_files").is_dir() {
        return Err(format!("{} has no test_files/", unpacked.display()));
    }
    std::fs::create_dir_all(cache.join("datafusion"))
        .map_err(|e| format!("creating {}: {e}", cache.display()))?;
    std::fs::rename(&unpacked, &dir).map_err(|e| format!("moving {}: {e}", dir.display()))?;
    std::fs::write(&stamp, CRATE_SHA256)
        .map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    Ok(dir)
}

/// The verified `.crate` archive: cargo's cached copy, else a download into `cache`.
fn archive(cache: &Path) -> Result<PathBuf, String> {
    let file = format!("{CRATE_NAME}-{CRATE_VERSION}.crate");
    for dir in registry_paths("cache") {
        let path = dir.join(&file);
        if let Ok(bytes) = std::fs::read(&path)
            && sha256_hex(&bytes) == CRATE_SHA256
        {
            return Ok(path);
        }
    }
    let path = cache.join(&file);
    if !std::fs::read(&path).is_ok_and(|b| sha256_hex(&b) == CRATE_SHA256) {
        let partial = cache.join(format!("{file}.part"));
        run(Command::new("curl")
            .args(["--silent", "--show-error", "--fail", "--location"])
            .args(["--max-time", "120", "--output"])
            .arg(&partial)
            .arg(CRATE_URL))?;
        let bytes = std::fs::read(&partial).map_err(|e| format!("reading download: {e}"))?;
        let got = sha256_hex(&bytes);
        if got != CRATE_SHA256 {
            return Err(format!(
                "{CRATE_URL}: SHA-256 {got}, expected {CRATE_SHA256} (not used)"
            ));
        }
        std::fs::rename(&partial, &path).map_err(|e| format!("saving {}: {e}", path.display()))?;
    }
    Ok(path)
}

/// `$CARGO_HOME/registry/<kind>/*` (one directory per registry index).
fn registry_paths(kind: &str) -> Vec<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(home) = home else {
        return vec![];
    };
    let Ok(entries) = std::fs::read_dir(home.join("registry").join(kind)) else {
        return vec![];
    };
    let mut dirs: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    dirs.sort();
    dirs
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|e| format!("running {command:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(())
}

/// SHA-256 (FIPS 180-4) of `data` as lower-case hex. Written out here because no SHA-256
/// crate is a dependency, and adding one for a checksum is not worth a build.
pub fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut message = data.to_vec();
    message.push(0x80);
    while message.len() % 64 != 56 {
        message.push(0);
    }
    message.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in message.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

/// Known answers of [`sha256_hex`] (FIPS 180-4 examples).
pub fn sha256_self_check() -> Result<(), String> {
    for (input, want) in [
        (
            &b""[..],
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        ),
        (
            &b"abc"[..],
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ),
    ] {
        let got = sha256_hex(input);
        if got != want {
            return Err(format!("sha256({input:?}) = {got}, expected {want}"));
        }
    }
    Ok(())
}
