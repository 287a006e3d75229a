#![cfg(feature = "flight")]
//! `fragvec serve --tls-cert --tls-key`: both endpoints speak TLS with the operator's
//! certificate — Flight SQL to arrow-flight's Rust client trusting that certificate, and the
//! PostgreSQL endpoint to psql with `sslmode=verify-full` (when psql is installed) — and
//! with users, a Flight client without credentials is refused.

#[path = "support/server.rs"]
mod server;

use std::path::Path;
use std::process::Command;

use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use futures::TryStreamExt;
use server::ServeProcess;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

/// A certificate for 127.0.0.1 and localhost signed by a CA of its own, made with openssl:
/// the CA's certificate (what clients trust), the server's certificate and key. `None`
/// (after saying why) when openssl is missing.
fn certificates(dir: &Path) -> Option<(String, String, String)> {
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let (ca, ca_key, csr, cert, key, ext) = (
        path("ca.pem"),
        path("ca-key.pem"),
        path("server.csr"),
        path("server.pem"),
        path("server-key.pem"),
        path("server.ext"),
    );
    std::fs::write(
        &ext,
        "basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    let steps: [Vec<&str>; 3] = [
        vec![
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=fragvec test CA",
            "-keyout",
            &ca_key,
            "-out",
            &ca,
        ],
        vec![
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            &key,
            "-out",
            &csr,
        ],
        vec![
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &ext,
            "-out",
            &cert,
        ],
    ];
    for args in steps {
        match Command::new("openssl").args(&args).output() {
            Ok(out) if out.status.success() => {}
            other => {
                eprintln!("skipping: openssl could not make the certificates: {other:?}");
                return None;
            }
        }
    }
    Some((ca, cert, key))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_endpoints_speak_tls() {
    let dir = tempfile::tempdir().unwrap();
    let Some((ca, cert, key)) = certificates(dir.path()) else {
        return;
    };
    let users = dir.path().join("users");
    std::fs::write(&users, "ann:pw-of-ann\n").unwrap();
    let server = ServeProcess::start(
        &dir.path().join("db"),
        &[
            "--flight",
            "127.0.0.1:0",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--users",
            users.to_str().unwrap(),
        ],
        2,
    );
    let address = server.address("grpc+tls");
    let endpoint = address.replacen("grpc+tls://", "https://", 1);
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&ca).unwrap()))
        .domain_name("localhost");
    let channel = Channel::from_shared(endpoint.clone())
        .unwrap()
        .tls_config(tls.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = FlightSqlServiceClient::new(channel.clone());
    // Without credentials: refused.
    let refused = client.execute("SELECT 1".into(), None).await.unwrap_err();
    assert!(
        refused.to_string().contains("needs a user and password"),
        "{refused}"
    );
    client.handshake("ann", "pw-of-ann").await.unwrap();
    let info = client.execute("SELECT 41 + 1".into(), None).await.unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let batches: Vec<RecordBatch> = client
        .do_get(ticket)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(
        batches[0].column(0).as_primitive::<Int64Type>().value(0),
        42
    );
    // A client that does not trust the certificate cannot connect.
    let untrusted = Channel::from_shared(endpoint)
        .unwrap()
        .tls_config(ClientTlsConfig::new().domain_name("localhost"))
        .unwrap()
        .connect()
        .await;
    let untrusted_call = match untrusted {
        Err(_) => true,
        Ok(ch) => FlightSqlServiceClient::new(ch)
            .handshake("ann", "pw-of-ann")
            .await
            .is_err(),
    };
    assert!(
        untrusted_call,
        "a client that does not trust the certificate got in"
    );

    // psql over TLS, verifying the certificate.
    let psql = std::env::var("FRAGVEC_PSQL").unwrap_or_else(|_| "psql".into());
    let conninfo = format!(
        "host=127.0.0.1 port={} user=ann dbname=fragvec sslmode=verify-full sslrootcert={ca}",
        server.address("postgresql").rsplit(':').next().unwrap()
    );
    match Command::new(&psql)
        .args(["-X", "-At", "-d", &conninfo, "-c", "SELECT 6 * 7"])
        .env("PGPASSWORD", "pw-of-ann")
        .env("PGCONNECT_TIMEOUT", "10")
        .output()
    {
        Ok(out) => {
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "psql over TLS: {stdout} {stderr}");
            assert_eq!(stdout.trim(), "42");
        }
        Err(e) => eprintln!("psql not run ({e}): the PostgreSQL endpoint's TLS is not checked"),
    }
    server.stop();
}
