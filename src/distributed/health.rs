//! Which of a coordinator's workers are up: those that a connection reaches, as far as the
//! coordinator knows. A query that fails on a transport error has the workers probed
//! ([`WorkerHealth::mark_unreachable`]); the unreachable ones are left out of new queries
//! (plans and task placement) and tried again every [`RETRY_DOWN_EVERY`] until they answer.

use std::sync::Arc;

use tokio::time::Duration;
use url::Url;

/// How often a worker found unreachable is tried again (a connection); once it answers it
/// is used again.
pub const RETRY_DOWN_EVERY: Duration = Duration::from_secs(1);

/// How long a connection to a worker may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The coordinator's workers and which of them are down.
#[derive(Debug)]
pub struct WorkerHealth {
    all: Vec<Url>,
    down: std::sync::Mutex<std::collections::HashSet<Url>>,
}

impl WorkerHealth {
    /// All of `all` reachable, until a query finds one is not.
    pub fn new(all: Vec<Url>) -> Self {
        Self {
            all,
            down: Default::default(),
        }
    }

    /// The workers not down (all of them when every one is: better to try than to refuse).
    pub fn up(&self) -> Vec<Url> {
        let down = self.down.lock().expect("worker health lock");
        let up: Vec<Url> = self
            .all
            .iter()
            .filter(|u| !down.contains(*u))
            .cloned()
            .collect();
        if up.is_empty() { self.all.clone() } else { up }
    }

    /// Connects to each worker now in use (concurrently) and marks those that do not
    /// answer down; returns them. Each is tried again every [`RETRY_DOWN_EVERY`] until it
    /// answers (then it is up again) or this health is dropped.
    pub async fn mark_unreachable(self: &Arc<Self>) -> Vec<Url> {
        let mut dead = self.unreachable().await;
        if dead.is_empty() {
            // A killed process's connections can fail before its listening socket is gone:
            // once more, a moment later.
            tokio::time::sleep(SETTLE).await;
            dead = self.unreachable().await;
        }
        for url in &dead {
            if !self
                .down
                .lock()
                .expect("worker health lock")
                .insert(url.clone())
            {
                continue; // already watched
            }
            let health = Arc::downgrade(self);
            let url = url.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(RETRY_DOWN_EVERY).await;
                    if health.upgrade().is_none() {
                        return;
                    }
                    if reachable(&url).await {
                        if let Some(health) = health.upgrade() {
                            health.down.lock().expect("worker health lock").remove(&url);
                        }
                        return;
                    }
                }
            });
        }
        dead
    }

    /// The workers now in use that a connection does not reach.
    async fn unreachable(&self) -> Vec<Url> {
        let probes = self
            .up()
            .into_iter()
            .map(|url| async move { (!reachable(&url).await).then_some(url) });
        futures::future::join_all(probes)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

/// How long after a failure the workers are probed a second time when the first probe
/// reached them all.
const SETTLE: Duration = Duration::from_millis(300);

/// Whether a TCP connection to `url`'s host and port opens within [`CONNECT_TIMEOUT`].
async fn reachable(url: &Url) -> bool {
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return false;
    };
    let connect = tokio::net::TcpStream::connect(format!("{host}:{port}"));
    matches!(
        tokio::time::timeout(CONNECT_TIMEOUT, connect).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unreachable_workers_are_left_out_until_they_answer_again() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let alive = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        // A port just freed: nothing listens there.
        let closed_addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let closed = Url::parse(&format!("http://{closed_addr}")).unwrap();
        let health = Arc::new(WorkerHealth::new(vec![alive.clone(), closed.clone()]));
        assert_eq!(health.up().len(), 2);
        assert_eq!(health.mark_unreachable().await, vec![closed.clone()]);
        assert_eq!(health.up(), vec![alive.clone()]);
        tokio::time::sleep(RETRY_DOWN_EVERY * 2).await;
        assert_eq!(health.up(), vec![alive.clone()], "still down: not back");
        // It comes back: used again within a retry.
        let _back = tokio::net::TcpListener::bind(closed_addr).await.unwrap();
        tokio::time::sleep(RETRY_DOWN_EVERY * 3).await;
        assert_eq!(health.up(), vec![alive.clone(), closed.clone()]);
        // Every worker down: all are tried rather than none.
        drop(listener);
        drop(_back);
        assert_eq!(health.mark_unreachable().await.len(), 2);
        assert_eq!(health.up().len(), 2);
    }
}
