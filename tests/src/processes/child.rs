//! A test of the running binary, run as a child process.

use std::time::Duration;

/// Where Debian's `faketime` package puts libfaketime.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// One test of the running test binary, run as a child process (`<test>
/// --exact --ignored --nocapture`): a second consumer, in a process of its
/// own, as the chaos tests run theirs. It talks on its stdout (lines the
/// parent waits for) and listens on its stdin; it is killed when this value
/// drops, also when the test panics.
#[derive(Debug)]
pub struct ChildTest {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl ChildTest {
    /// Runs `test` (an `#[ignore]`d test of this binary) with `env` added to
    /// its environment.
    pub fn spawn(test: &str, env: &[(&str, &str)]) -> ChildTest {
        let exe = std::env::current_exe().expect("the test binary");
        let mut command = std::process::Command::new(exe);
        command
            .args([test, "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads=1"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("start the child test");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("the child's stdout");
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        // Read on a thread of its own, so the child never blocks on a full
        // pipe and the parent's runtime never blocks on a read.
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildTest {
            child,
            stdin,
            lines,
        }
    }

    /// What follows `prefix` on the next line of the child's that holds it
    /// (other lines are skipped); panics after `within`, or when the child
    /// ends first.
    pub async fn line(&mut self, prefix: &str, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    // Anywhere in the line: libtest's `test name ... ` may
                    // come first.
                    if let Some(at) = line.find(prefix) {
                        return line[at + prefix.len()..].trim().to_owned();
                    }
                }
                Ok(None) => panic!("the child test ended before it printed {prefix:?}"),
                Err(_) => panic!("the child test printed no {prefix:?} within {within:?}"),
            }
        }
    }

    /// Writes `line` to the child's stdin.
    pub fn send(&mut self, line: &str) {
        use std::io::Write as _;
        let stdin = self.stdin.as_mut().expect("the child's stdin");
        writeln!(stdin, "{line}").expect("write to the child");
        stdin.flush().expect("flush to the child");
    }

    /// Kills the child with SIGKILL (no unwinding, no destructors, no
    /// shutdown of its sockets or transactions but the kernel's) and reaps
    /// it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (at most `within`) for the child to exit; panics unless it
    /// succeeded.
    pub async fn finish(mut self, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                assert!(status.success(), "the child test failed: {status}");
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the child test did not exit within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ChildTest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
