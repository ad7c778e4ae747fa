//! A server process of a test's own: started in a scratch directory,
//! waited for until its port takes connections, killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::processes::ScratchDir;

/// Why a server of a test's own did not start: its program is not
/// installed (the test skips, as for a shared server that is down), or it
/// failed (the test fails: a bad configuration, a port taken).
#[derive(Debug)]
pub enum ServerError {
    /// A program the server needs is not installed.
    Missing(String),
    /// The server did not start.
    Failed(String),
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerError::Missing(why) => write!(f, "not installed: {why}"),
            ServerError::Failed(why) => write!(f, "did not start: {why}"),
        }
    }
}

impl From<String> for ServerError {
    fn from(why: String) -> Self {
        ServerError::Failed(why)
    }
}

/// A program spawned, or why not: a program that is not there is
/// [`ServerError::Missing`].
fn spawned(command: &mut Command) -> Result<Child, ServerError> {
    command.spawn().map_err(|e| {
        let why = format!("cannot start {:?}: {e}", command.get_program());
        if e.kind() == std::io::ErrorKind::NotFound {
            ServerError::Missing(why)
        } else {
            ServerError::Failed(why)
        }
    })
}

/// A running server; killed (SIGKILL, and `stop` first when it has one)
/// when dropped, its directory removed.
#[derive(Debug)]
pub(crate) struct Daemon {
    name: &'static str,
    child: Option<Child>,
    stop: Option<Command>,
    log: PathBuf,
    // dropped last: the directory goes once the process is gone
    dir: ScratchDir,
}

impl Daemon {
    /// A scratch directory for a server called `name`.
    pub(crate) fn dir(name: &str) -> Result<ScratchDir, ServerError> {
        ScratchDir::new(name).map_err(|e| ServerError::Failed(format!("scratch directory: {e}")))
    }

    /// Spawns `command` (its output to `<dir>/<name>.log`, in a process
    /// group of its own, which the drop kills whole) and waits until `port`
    /// on 127.0.0.1 takes connections, at most `within`. `stop`, run before
    /// the kill, stops it cleanly (also when it fails to start).
    pub(crate) fn spawn(
        name: &'static str,
        dir: ScratchDir,
        mut command: Command,
        stop: Option<Command>,
        port: u16,
        within: Duration,
    ) -> Result<Daemon, ServerError> {
        use std::os::unix::process::CommandExt as _;
        let log = dir.0.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).map_err(|e| format!("{name} log: {e}"))?;
        let err = out.try_clone().map_err(|e| format!("{name} log: {e}"))?;
        let child = spawned(
            command
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .process_group(0),
        )?;
        let mut daemon = Daemon {
            name,
            child: Some(child),
            stop,
            log,
            dir,
        };
        daemon.wait_for(port, within)?;
        Ok(daemon)
    }

    /// The server's directory.
    pub(crate) fn path(&self) -> &Path {
        &self.dir.0
    }

    /// The end of the server's log, for a message.
    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    fn wait_for(&mut self, port: u16, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let listening = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            // after the connect: a server that found its port taken has
            // exited, and the listener was another's
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "{} exited ({status}) before it listened on {port}:\n{}",
                    self.name,
                    self.log_tail()
                ));
            }
            if listening {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not listen on {port} within {within:?}:\n{}",
                    self.name,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut stop) = self.stop.take() {
            let _ = stop
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if let Some(mut child) = self.child.take() {
            // the whole group: a server's script may have started it in
            // the background (RabbitMQ's), or it has children (PostgreSQL's)
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `program` run to its end; its output when it fails.
pub(crate) fn run(mut command: Command) -> Result<(), ServerError> {
    let out = command.stdin(Stdio::null()).output().map_err(|e| {
        let why = format!("cannot run {:?}: {e}", command.get_program());
        if e.kind() == std::io::ErrorKind::NotFound {
            ServerError::Missing(why)
        } else {
            ServerError::Failed(why)
        }
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ServerError::Failed(format!(
            "{:?} failed ({}): {}{}",
            command.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// The uid and gid of a system user, when running as root (a server that
/// refuses to run as root runs as it); `None` otherwise.
pub(crate) fn as_user(name: &str) -> Option<(u32, u32)> {
    let id = |flag| {
        Command::new("id")
            .args([flag, name])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<u32>()
                    .ok()
            })
    };
    let root = Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .is_some_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        return None;
    }
    Some((id("-u")?, id("-g")?))
}

/// Gives `path` (recursively) to `uid:gid`.
pub(crate) fn chown(path: &Path, (uid, gid): (u32, u32)) -> Result<(), ServerError> {
    let mut c = Command::new("chown");
    c.arg("-R").arg(format!("{uid}:{gid}")).arg(path);
    run(c)
}
