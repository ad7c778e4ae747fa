//! tansu, a Kafka-API broker in memory, started on a free port.

use std::time::Duration;

use super::free_port;
use crate::services::unavailable;

/// A throw-away tansu (a Kafka-API broker, in memory) on a free loopback
/// port, advertising to clients the address of the test's choosing (a
/// [`CutProxy`](crate::brokers::CutProxy) in front of it, say); killed
/// (SIGKILL) when dropped.
#[derive(Debug)]
pub struct TansuServer {
    child: std::process::Child,
    port: u16,
}

impl TansuServer {
    /// Starts tansu advertising `127.0.0.1:<advertised>`, or returns `None`
    /// (after [`unavailable`]) when it is not installed or will not start.
    pub fn start(advertised: u16) -> Option<TansuServer> {
        let port = match free_port() {
            Ok(p) => p,
            Err(e) => return unavailable("tansu", "a free port", e),
        };
        let listen = format!("tcp://127.0.0.1:{port}");
        let advertise = format!("tcp://127.0.0.1:{advertised}");
        let child = std::process::Command::new(crate::brokers::tansu_program())
            .args([
                "broker",
                "--listener-url",
                &listen,
                "--advertised-listener-url",
                &advertise,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                return unavailable(
                    "tansu",
                    "its binary (cargo install tansu --version 0.6.0 --locked --features dynostore)",
                    e,
                );
            }
        };
        let server = TansuServer { child, port };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if std::time::Instant::now() > deadline {
                return unavailable("tansu", &listen, "it did not listen within 5 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(server)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for TansuServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
