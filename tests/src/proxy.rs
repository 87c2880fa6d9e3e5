//! A TCP proxy in front of a real broker, for connection faults the broker cannot make on
//! its own: refuse new connections, accept and never answer (a blackholed node), freeze
//! the broker's replies (confirms stop arriving), and cut every live connection.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Relays both ways.
    Forward,
    /// Closes new connections at once (a node that is down).
    Refuse,
    /// Accepts new connections and never answers (a blackholed node).
    Blackhole,
    /// Relays client to broker, but holds the broker's replies (confirms, heartbeats).
    Freeze,
}

/// A proxy on a free local port; stops (closing every connection) on drop.
#[derive(Debug)]
pub struct Proxy {
    /// The local port clients connect to.
    pub port: u16,
    mode: watch::Sender<Mode>,
    cut: watch::Sender<u64>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Starts relaying to `upstream` (`host:port`) in `mode`.
    pub async fn start(upstream: &str, mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (mode_tx, mode_rx) = watch::channel(mode);
        let (cut_tx, cut_rx) = watch::channel(0u64);
        let upstream: Arc<str> = upstream.into();
        let accept = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let mode = *mode_rx.borrow();
                match mode {
                    Mode::Refuse => drop(client),
                    Mode::Blackhole => held.push(client),
                    Mode::Forward | Mode::Freeze => {
                        let (up, m, c) = (upstream.clone(), mode_rx.clone(), cut_rx.clone());
                        tokio::spawn(relay(client, up, m, c));
                    }
                }
            }
        });
        Self {
            port,
            mode: mode_tx,
            cut: cut_tx,
            accept,
        }
    }

    /// Changes the mode for new connections (and `Freeze`/`Forward` for live ones).
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Closes every live relayed connection, as a network failure would.
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// `amqp://user:pass@127.0.0.1:PORT/vhost` through this proxy.
    pub fn url(&self, userinfo: &str, vhost: &str) -> String {
        format!("amqp://{userinfo}@127.0.0.1:{}/{vhost}", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn relay(
    client: TcpStream,
    upstream: Arc<str>,
    mode: watch::Receiver<Mode>,
    mut cut: watch::Receiver<u64>,
) {
    // Only cuts made after this connection arrived concern it.
    cut.borrow_and_update();
    let Ok(server) = TcpStream::connect(&*upstream).await else {
        return;
    };
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if sw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let down = async {
        let mut mode = mode;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if mode.wait_for(|m| *m != Mode::Freeze).await.is_err() {
                return;
            }
            match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    // Read before the freeze began: hold it until the freeze ends.
                    if mode.wait_for(|m| *m != Mode::Freeze).await.is_err() {
                        return;
                    }
                    if cw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut.changed() => {}
    }
}
