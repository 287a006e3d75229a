//! Where a test puts a database on S3.
//!
//! `FRAGVEC_TEST_S3=s3://bucket/prefix` names a prefix on a test server (`.ci/s3-server start`
//! starts moto and prints it, with the `AWS_*` variables object_store reads); each test gets
//! its own prefix below it. Without it the S3 variants of the tests print why they are
//! skipped and pass, unless `FRAGVEC_REQUIRE_S3=1` (set by `.ci/run`), which makes a missing
//! server a failure.

// Each test crate includes this module and uses some of it.
#![allow(dead_code)]

/// The configured `s3://bucket/prefix`, if any.
pub fn s3_base() -> Option<String> {
    std::env::var("FRAGVEC_TEST_S3")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| v.trim_end_matches('/').to_string())
}

/// A fresh database location on the test S3 server for `test`, or `None` (after saying why)
/// when no server is configured. Panics when one is required (`FRAGVEC_REQUIRE_S3=1`).
pub fn s3_location(test: &str) -> Option<String> {
    match s3_base() {
        Some(base) => Some(format!("{base}/{test}-{:016x}", rand::random::<u64>())),
        None => {
            if let Err(e) = skip(test) {
                panic!("{e}");
            }
            None
        }
    }
}

/// Says that `test` is skipped on S3 (no server configured); an error when S3 is required.
pub fn skip(test: &str) -> Result<(), String> {
    if std::env::var("FRAGVEC_REQUIRE_S3").as_deref() == Ok("1") {
        return Err(format!(
            "{test}: FRAGVEC_REQUIRE_S3=1 but FRAGVEC_TEST_S3 is not set: the S3 tests must run \
             here (start moto with `eval \"$(.ci/s3-server start)\"`)"
        ));
    }
    eprintln!(
        "{test}: skipped on S3: FRAGVEC_TEST_S3 not set (start moto with .ci/s3-server or see docs/object-storage.md)"
    );
    Ok(())
}

/// Where a test's database lives: a scratch directory (removed when this is dropped) or a
/// fresh prefix on the test S3 server.
pub struct Location {
    url: String,
    _dir: Option<tempfile::TempDir>,
}

impl Location {
    pub fn local() -> Self {
        let dir = tempfile::tempdir().expect("scratch directory");
        Self {
            url: dir.path().to_str().expect("UTF-8 path").to_string(),
            _dir: Some(dir),
        }
    }

    /// A prefix on the test S3 server, or `None` (skipped) when none is configured.
    pub fn s3(test: &str) -> Option<Self> {
        s3_location(test).map(|url| Self { url, _dir: None })
    }

    /// What `fragvec --db` and `FragvecSession::open` take.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Another database below this one (for tests that need several fresh ones).
    pub fn child(&self, name: &str) -> String {
        format!("{}/{name}", self.url)
    }
}

/// `on_local_and_s3!(scenario)`: an `async fn scenario(db: Location)` becomes two tests,
/// `scenario::local` on a scratch directory and `scenario::on_s3` on the test S3 server.
#[allow(unused_macros)]
macro_rules! on_local_and_s3 {
    ($scenario:ident) => {
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn local() {
                super::$scenario(crate::support::Location::local()).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_s3() {
                if let Some(db) = crate::support::Location::s3(stringify!($scenario)) {
                    super::$scenario(db).await
                }
            }
        }
    };
}

/// The first column of `sql`'s rows, cast to `T` (counts are signed, figures unsigned).
pub async fn column<T: datafusion::arrow::datatypes::ArrowPrimitiveType>(
    s: &fragvec::FragvecSession,
    sql: &str,
) -> Vec<T::Native> {
    use datafusion::arrow::array::AsArray;
    let r = s
        .sql_one(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    r.batches
        .iter()
        .flat_map(|b| {
            let c = datafusion::arrow::compute::cast(b.column(0), &T::DATA_TYPE).unwrap();
            c.as_primitive::<T>().values().to_vec()
        })
        .collect()
}
